"""Tensor parallelism of the Llama runtime, Megatron-style: what one rank of N holds and reduces.

    q/k/v_proj, gate/up_proj   column-split: rank r keeps its heads (its KV head, replicated when
                               there are fewer KV heads than ranks) and its slice of the MLP columns
    o_proj, down_proj          row-split: each rank's partial sum, then one all-reduce (a bias is
                               held by rank 0 alone, zeros elsewhere, so it is added once)
    embed_tokens, norms,       replicated: every rank computes the same full logits, so sampling
    lm_head                    needs no gather (docs/serving.md says why)

The all-reduce is `_c10d_functional.all_reduce` + `wait_tensor` on a named group: the ops
torch.export keeps and AOTInductor lowers to its C shim, so one package serves every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a tensor is made: `Parallel` is read by torch-free modules
    from torch import Tensor

    from prebake.engine.bundled.runtime.weights import LlamaConfig

DEFAULT_GROUP = "0"  # the name torch gives the default process group (fake or gloo alike)
_COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_ROW = ("self_attn.o_proj", "mlp.down_proj")


@dataclass(frozen=True)
class Parallel:
    """One rank of a tensor-parallel group: which rank, of how many, over which process group."""

    rank: int
    world: int
    group: str = DEFAULT_GROUP

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in 0..{self.world - 1} (a tp={self.world} group)")


def split_problem(config: LlamaConfig, world: int) -> str | None:
    """Why `config` cannot be split over `world` ranks, or None (the recipe's `_tp_divides_heads` rule)."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % world or (kv % world and world % kv) or config.intermediate_size % world:
        return (
            f"tp {world} does not split {heads} attention heads, {kv} KV heads and "
            f"{config.intermediate_size} MLP columns evenly; use a TP size that divides them"
        )
    return None


def local_config(config: LlamaConfig, parallel: Parallel | None) -> LlamaConfig:
    """The architecture one rank runs: its share of the heads and MLP columns (the whole at tp=1)."""
    if parallel is None or parallel.world == 1:
        return config
    if problem := split_problem(config, parallel.world):
        raise ValueError(problem)
    return dataclasses.replace(
        config,
        num_attention_heads=config.num_attention_heads // parallel.world,
        num_key_value_heads=max(1, config.num_key_value_heads // parallel.world),
        intermediate_size=config.intermediate_size // parallel.world,
    )


def shard_state_dict(
    config: LlamaConfig, state_dict: Mapping[str, Tensor], parallel: Parallel | None
) -> dict[str, Tensor]:
    """Rank `parallel.rank`'s tensors (views where a slice is contiguous) of a full state dict."""
    if parallel is None or parallel.world == 1:
        return dict(state_dict)
    local = local_config(config, parallel)
    r, n, d = parallel.rank, parallel.world, config.head_dim
    kv_first = (
        r * local.num_key_value_heads if config.num_key_value_heads >= n else r // (n // config.num_key_value_heads)
    )
    rows = {
        "self_attn.q_proj": (r * local.num_attention_heads * d, local.num_attention_heads * d),
        "self_attn.k_proj": (kv_first * d, local.num_key_value_heads * d),
        "self_attn.v_proj": (kv_first * d, local.num_key_value_heads * d),
        "mlp.gate_proj": (r * local.intermediate_size, local.intermediate_size),
        "mlp.up_proj": (r * local.intermediate_size, local.intermediate_size),
    }
    columns = {
        "self_attn.o_proj": (r * local.num_attention_heads * d, local.num_attention_heads * d),
        "mlp.down_proj": (r * local.intermediate_size, local.intermediate_size),
    }
    import torch

    out = {}
    for name, tensor in state_dict.items():
        module, _, leaf = name.removeprefix("layers.").partition(".")[2].rpartition(".")
        if module in rows:
            out[name] = tensor.narrow(0, *rows[module])
        elif module in columns and leaf == "weight":
            out[name] = tensor.narrow(1, *columns[module])
        elif module in columns:  # a row-parallel bias: added once, after the reduce
            out[name] = tensor if r == 0 else torch.zeros_like(tensor)
        else:
            out[name] = tensor
    return out


def all_reduce(x: Tensor, parallel: Parallel | None) -> Tensor:
    """The sum of `x` over the group (x itself at tp=1), as ops export and AOTInductor keep."""
    if parallel is None or parallel.world == 1:
        return x
    import torch

    reduced = torch.ops._c10d_functional.all_reduce(x, "sum", parallel.group)
    return torch.ops._c10d_functional.wait_tensor(reduced)


def world_group_name() -> str:
    """The default process group's name: what the package's collectives were traced with."""
    import torch.distributed as dist

    group = dist.group.WORLD
    if group is None:
        raise RuntimeError("no process group is initialised; join one first")
    return group.group_name


@contextmanager
def one_rank_of(world: int) -> Iterator[Parallel]:
    """This process as rank 0 of a fake process group of `world` ranks (torch's "fake" backend,
    which answers every collective at once without peers): what a tp=N package is compiled under,
    in one process. The group is destroyed on exit."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised here; compile a tp>1 target in a fresh process")
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield Parallel(0, world, world_group_name())
    finally:
        dist.destroy_process_group()
