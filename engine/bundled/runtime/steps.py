"""Compiled prefill and decode steps, one static graph per step shape.

`CompiledSteps` is shared by the graphs builder (which compiles every shape into a
private Inductor cache: the artifact) and the serving engine (which compiles the same
shapes with Inductor's cache pointed at the installed artifact: cache hits). Because both
go through this one class, the graphs they produce have the same cache keys.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from prebake.engine.bundled.runtime.fp8_linear import is_fp8
from prebake.engine.bundled.runtime.gemv import decode_matmuls
from prebake.engine.bundled.runtime.model import KVCache, Llama
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.common.logs import Countdown


@dataclass(frozen=True)
class Tactic:
    """How one step shape runs: the attention implementation. The thread count is no tactic: it is
    the serving host's (torch's default there), read by every kernel when it runs (`threads_at_run_time`)."""

    attn_impl: str = "sdpa"

    def label(self) -> str:
        return f"attn_impl={self.attn_impl}"


def threads_at_run_time() -> None:
    """Compile kernels that take their OpenMP thread count when they run, not when they are built.

    With Inductor's `cpp.dynamic_threads` off (its default) every C++ kernel is generated for
    `torch.get_num_threads()` of the compiling process (`#pragma omp parallel num_threads(N)`,
    reduction buffers of N, no parallel region at all for 1), and that count joins the FX-graph and
    AOTAutograd cache keys: a graph baked on a 1-core builder (or under `taskset`) serves one thread
    per kernel on a 32-core host, and a start whose thread count differs from the bake's misses the
    cache. On, kernels open `#pragma omp parallel` and size their buffers by omp_get_max_threads()
    at run time, and the count leaves the keys (torch 2.13: codegen/cpp.py, codecache.py). Every
    graphs variant compiles under it; docs/graphs-variants.md has the measurement."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.dynamic_threads = True


def decode_products_as_reductions(model: Llama) -> None:
    """Compile one-row matrix products and one-query attention as Inductor reductions (runtime.gemv),
    as the aoti-package variant's bake does (aoti.package_options); an FP8 model's stay as they are."""
    import torch._inductor.config as inductor_config

    inductor_config.post_grad_custom_post_pass = None if is_fp8(model) else decode_matmuls()


class CompiledSteps:
    """torch.compile'd prefill/decode of one model, dispatching per step shape."""

    def __init__(
        self, model: Llama, cache: KVCache, *, compile: bool = True, mode: str = "default", expected_shapes: int = 64
    ):
        self.model, self.cache = model, cache
        # Callers (the scheduler, warm-up, autotune) build step inputs on the CPU; on a GPU they are
        # moved to the cache's device here, and the logits come back to the CPU for sampling.
        self.device = cache.keys[0].device
        if compile:
            threads_at_run_time()  # the builder and the engine alike: the same cache keys
            decode_products_as_reductions(model)
            # Every bucket is one static graph: allow one recompilation per shape, never fall back to eager.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, expected_shapes + 8)
            torch._dynamo.config.accumulated_recompile_limit = max(
                torch._dynamo.config.accumulated_recompile_limit, 4 * expected_shapes + 64
            )
            kwargs: dict = {"dynamic": False, "fullgraph": True}
            if mode != "default":
                kwargs["mode"] = mode
            self._prefill = torch.compile(model.prefill, **kwargs)
            self._decode = torch.compile(model.decode, **kwargs)
        else:
            self._prefill, self._decode = model.prefill, model.decode

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor, tactic: Tactic) -> torch.Tensor:
        if self.device.type != "cpu":
            ids, lengths, slots = ids.to(self.device), lengths.to(self.device), slots.to(self.device)
            return self._prefill(ids, lengths, slots, self.cache, tactic.attn_impl).cpu()
        return self._prefill(ids, lengths, slots, self.cache, tactic.attn_impl)

    def decode(
        self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, ctx_len: int, tactic: Tactic
    ) -> torch.Tensor:
        if self.device.type != "cpu":
            ids, positions, slots = ids.to(self.device), positions.to(self.device), slots.to(self.device)
            return self._decode(ids, positions, slots, self.cache, ctx_len, tactic.attn_impl).cpu()
        return self._decode(ids, positions, slots, self.cache, ctx_len, tactic.attn_impl)

    def run_dummy(self, shape: StepShape, tactic: Tactic) -> torch.Tensor:
        """One step of `shape` on placeholder tokens: what warm-up and autotune run."""
        b = shape.batch
        slots = torch.arange(b)
        ids = torch.ones((b, shape.tokens), dtype=torch.long)
        if shape.phase == "prefill":
            return self.prefill(ids, torch.full((b,), shape.tokens), slots, tactic)
        return self.decode(ids[:, 0], torch.full((b,), shape.ctx_len - 1), slots, shape.ctx_len, tactic)

    def warm_up(self, tactics: dict[StepShape, Tactic], log=print) -> dict[StepShape, float]:
        """Run every shape once (compiling it, or loading it from cache); seconds per shape."""
        seconds = {}
        countdown = Countdown(len(tactics))
        for shape, tactic in tactics.items():
            started = time.perf_counter()
            self.run_dummy(shape, tactic)
            seconds[shape] = time.perf_counter() - started
            log("  " + countdown.line(f"warm-up {shape.name} [{tactic.label()}] {seconds[shape]:.2f} s"))
        return seconds
