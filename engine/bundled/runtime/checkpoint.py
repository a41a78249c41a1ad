"""Seeded random weights written once as a Hugging Face checkpoint, for recipes of real sizes.

    $PREBAKE_HOME/models/<name>/<digest>/        digest: architecture, seed, dtype and this format
        config.json                              the recipe's [model.config], torch_dtype added
        model-00001-of-0000N.safetensors         shards of at most SHARD_BYTES, by HF name
        model.safetensors.index.json             {"metadata": {"total_size": ...}, "weight_map": {...}}
    $PREBAKE_HOME/models/<name>/<digest>.lock    held while the folder is written

Written under a partial name and renamed into place, under the lock: a start that dies half way
leaves nothing complete-looking, racing starts write it once. Values: windows of one seeded pool at
seeded offsets, scaled as `tiny_random_weights` scales: gigabytes at copy speed, the same bits anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from prebake.artifacts.fsutil import Flock, fsync_dir, write_bytes
from prebake.artifacts.keys import canonical_json, sha256_hex
from prebake.artifacts.recipe.quantization import RANDOM_FP8
from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.fp8_linear import quantize_rows
from prebake.engine.bundled.runtime.weights import CONFIG_FILE, INDEX_FILE, LlamaConfig, hf_name, parameter_shapes

MODELS_DIR = "models"
FORMAT = 1  # of the values below: a change writes a new folder, never reuses an old one
SHARD_BYTES = 2 << 30  # what one shard holds at most (it is built in memory before it is written)
CHECKPOINT_DTYPE = torch.bfloat16  # what a downloaded Llama checkpoint holds
_POOL = (1 << 24) + 1021  # values in the pool: not a multiple of any width, so rows do not repeat in step
_PARTIAL = ".partial-"


@dataclass(frozen=True)
class Checkpoint:
    """A random checkpoint's folder, and whether this call wrote it."""

    folder: Path
    written: bool


def checkpoint_folder(spec: ModelSpec, home: Path, fp8: bool = False) -> Path:
    """Where `spec`'s random checkpoint lives under `home` (written or not); `fp8`: its FP8 twin (the
    same seeded values, linears quantized per channel in compressed-tensors' FP8_DYNAMIC format)."""
    identity = {
        "architecture": spec.architecture(),
        "seed": spec.seed,
        "dtype": str(CHECKPOINT_DTYPE),
        "format": FORMAT,
        **({"quantization": RANDOM_FP8.factors()} if fp8 else {}),
    }
    return home / MODELS_DIR / spec.name / sha256_hex(canonical_json(identity))[:16]


def random_checkpoint(spec: ModelSpec, home: Path, log=print, fp8: bool = False) -> Checkpoint:
    """`spec`'s random checkpoint (`fp8`: its FP8 twin), written first if no complete one is there."""
    folder = checkpoint_folder(spec, home, fp8)
    if (folder / CONFIG_FILE).is_file():
        return Checkpoint(folder, written=False)
    with Flock.hold(folder.with_name(folder.name + ".lock")):
        if (folder / CONFIG_FILE).is_file():  # written by whoever held the lock before us
            return Checkpoint(folder, written=False)
        config = LlamaConfig.from_hf(spec.config)
        size = _size(config, fp8) / 2**30
        log(f"writing {spec.name}'s random {'FP8 ' if fp8 else ''}checkpoint once ({size:.1f} GiB) into {folder}")
        partial = folder.with_name(_PARTIAL + folder.name)
        shutil.rmtree(partial, ignore_errors=True)  # a writer that died: the lock is ours, nobody writes it
        partial.mkdir(parents=True)
        _write(spec, config, partial, fp8)
        partial.rename(folder)
        fsync_dir(folder.parent)
    return Checkpoint(folder, written=True)


def seeded_tensors(config: LlamaConfig, seed: int, dtype: torch.dtype) -> Iterator[tuple[str, Tensor]]:
    """Every tensor of `config` by runtime name (sorted), in `dtype`, from one seeded pool."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    pool = torch.rand(_POOL, generator=generator, dtype=torch.float32) * 2 - 1
    scaled: dict[tuple[float, float], Tensor] = {}
    for name, shape in sorted(parameter_shapes(config).items()):
        scale, shift = _scale(name, shape)
        if (scale, shift) not in scaled:
            scaled[scale, shift] = (pool * scale + shift).to(dtype)
        offset = int(torch.randint(_POOL, (1,), generator=generator))
        yield name, _window(scaled[scale, shift], offset, shape)


def _scale(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """The scale and shift of a uniform [-1, 1) value for this tensor (tiny_random_weights' own)."""
    if name.endswith("norm.weight"):
        return 0.1, 1.0
    if name == "embed_tokens.weight":
        return 3**0.5, 0.0
    if name.endswith(".bias"):
        return 0.1, 0.0
    return (3 / shape[1]) ** 0.5, 0.0


def _window(pool: Tensor, offset: int, shape: tuple[int, ...]) -> Tensor:
    out = torch.empty(shape, dtype=pool.dtype).view(-1)
    done = 0
    while done < out.numel():
        take = min(out.numel() - done, pool.numel() - offset)
        out[done : done + take] = pool[offset : offset + take]
        done, offset = done + take, 0
    return out.view(shape)


def _write(spec: ModelSpec, config: LlamaConfig, folder: Path, fp8: bool = False) -> None:
    """The shards, then the index, then config.json: the config is what marks the folder complete."""
    plan = _shard_plan(config, fp8)
    total = max(plan.values())
    shard: dict[str, Tensor] = {}
    number = 1
    for runtime_name, value in seeded_tensors(config, spec.seed, CHECKPOINT_DTYPE):
        for name, tensor in _stored(runtime_name, value, fp8):
            if plan[name] != number:
                _save(shard, folder / _shard_name(number, total))
                shard, number = {}, plan[name]
            shard[name] = tensor
    _save(shard, folder / _shard_name(number, total))
    index = {
        "metadata": {"total_size": _size(config, fp8)},
        "weight_map": {k: _shard_name(v, total) for k, v in sorted(plan.items())},
    }
    write_bytes(folder / INDEX_FILE, json.dumps(index, indent=2).encode() + b"\n")
    hf = {**spec.config, "torch_dtype": str(CHECKPOINT_DTYPE).removeprefix("torch.")}
    if fp8:
        hf["quantization_config"] = _FP8_CONFIG
    write_bytes(folder / CONFIG_FILE, json.dumps(hf, indent=2, sort_keys=True).encode() + b"\n")


# compressed-tensors' FP8_DYNAMIC, as llm-compressor writes it (RANDOM_FP8 is its scheme)
_FP8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "ignore": list(RANDOM_FP8.excluded),
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
        }
    },
}


def _quantized(runtime_name: str, fp8: bool) -> bool:
    """Whether the FP8 twin stores this tensor as FP8 + scale: every decoder linear's weight."""
    return fp8 and runtime_name.startswith("layers.") and runtime_name.endswith("_proj.weight")


def _stored(runtime_name: str, value: Tensor, fp8: bool) -> list[tuple[str, Tensor]]:
    """What the checkpoint stores for one runtime tensor, by HF name."""
    name = hf_name(runtime_name)
    if not _quantized(runtime_name, fp8):
        return [(name, value)]
    weight, scale = quantize_rows(value)
    return [(name, weight), (name.removesuffix("weight") + "weight_scale", scale[:, None])]  # fp32, as made


def _entries(config: LlamaConfig, fp8: bool) -> list[tuple[str, int]]:
    """Every stored tensor's HF name and size in bytes, in the order _write stores them."""
    itemsize = torch.tensor([], dtype=CHECKPOINT_DTYPE).element_size()
    entries = []
    for name, shape in sorted(parameter_shapes(config).items()):
        if _quantized(name, fp8):
            entries += [
                (hf_name(name), _numel(shape)),
                (hf_name(name).removesuffix("weight") + "weight_scale", 4 * shape[0]),
            ]
        else:
            entries.append((hf_name(name), itemsize * _numel(shape)))
    return entries


def _shard_plan(config: LlamaConfig, fp8: bool = False) -> dict[str, int]:
    """Each stored tensor's shard number (from 1), by HF name."""
    plan, shard, held = {}, 1, 0
    for name, size in _entries(config, fp8):
        if held and held + size > SHARD_BYTES:
            shard, held = shard + 1, 0
        plan[name], held = shard, held + size
    return plan


def _save(tensors: dict[str, Tensor], path: Path) -> None:
    save_file(tensors, str(path), metadata={"format": "pt"})
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _shard_name(number: int, total: int) -> str:
    return f"model-{number:05d}-of-{total:05d}.safetensors"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _size(config: LlamaConfig, fp8: bool = False) -> int:
    return sum(size for _, size in _entries(config, fp8))
