"""Loading a recipe's model: seeded random weights, a random checkpoint written once, a GGUF file
dequantized once into a folder (gguf_folder), or a Hugging Face folder; and the two models a bake
makes without them: placeholders (storage reserved, never touched: a compile that keeps weights out
of its output) and a copy cut to a few layers (autotune's timings)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from prebake.artifacts.errors import BuildError
from prebake.artifacts.extras import require
from prebake.artifacts.recipe.schema import RANDOM_CHECKPOINT, RANDOM_WEIGHTS, ModelSpec
from prebake.artifacts.store.settings import default_home
from prebake.engine.bundled.runtime.checkpoint import random_checkpoint, seeded_tensors
from prebake.engine.bundled.runtime.gguf_folder import gguf_folder, gguf_folder_path
from prebake.engine.bundled.runtime.model import Llama, SkipInit, build_model, rope_inv_freq
from prebake.engine.bundled.runtime.parallel import Parallel, local_config
from prebake.engine.bundled.runtime.weights import LlamaConfig, load_hf_folder, tiny_random_weights

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise BuildError(
            f"dtype {name!r} has no CPU runtime in the bundled engine (it runs {sorted(TORCH_DTYPES)}); "
            f"fp8 builds need a CUDA sm_89+ or Gaudi runner and an engine adapter"
        )
    return TORCH_DTYPES[name]


def load_model(
    spec: ModelSpec,
    dtype: str,
    device: str = "cpu",
    parallel: Parallel | None = None,
    home: Path | None = None,
    log=print,
) -> Llama:
    """The runtime for a recipe's [model] on `device` (with `parallel`, one rank's shard of it): its
    inline config with seeded weights, its random checkpoint or its GGUF's dequantized folder under
    `home` ($PREBAKE_HOME; written on first need) or its folder, all read by mmap."""
    if spec.weights == RANDOM_WEIGHTS:
        config = LlamaConfig.from_hf(spec.config)
        state = tiny_random_weights(config, seed=spec.seed)  # made on the CPU: the same bits on any machine
        return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)
    if spec.weights == RANDOM_CHECKPOINT:
        folder = random_checkpoint(spec, home or default_home(), log=log).folder
    elif spec.gguf is not None:
        require("gguf", f"weights {spec.weights!r}")
        folder = gguf_folder(spec, torch_dtype(dtype), home or default_home(), log=log)
    else:
        folder = Path(spec.weights).expanduser()
    config, state = load_hf_folder(folder, torch_dtype(dtype))
    return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)


def model_folder(spec: ModelSpec, dtype: str, home: Path | None = None) -> Path | None:
    """The Hugging Face folder a start of `spec` in `dtype` reads (its tokenizer and chat template
    too): the user's folder, the GGUF's dequantized one; None for seeded random weights."""
    if spec.random_weights:
        return None
    if spec.gguf is not None:
        return gguf_folder_path(spec, torch_dtype(dtype), home or default_home())
    return Path(spec.weights).expanduser()


def placeholder_model(spec: ModelSpec, dtype: str, device: str = "cpu", parallel: Parallel | None = None) -> Llama:
    """The recipe's model (one rank's shard with `parallel`) whose tensors have storage that is
    reserved and never written or read.

    What a compile needs that keeps the weights out of what it writes (an AOTInductor package binds
    them at load): their shapes, dtypes and distinct storages. The pages of an allocation nobody
    touches are never made resident, so the bake's memory does not grow with the weights. (Fake
    tensors would not do: Inductor dedupes constants by storage pointer, and every fake's is 0.)"""
    config = LlamaConfig.from_hf(spec.config)
    with torch.device("meta"), SkipInit():
        model = Llama(local_config(config, parallel), torch_dtype(dtype), parallel)
    model = model.to_empty(device=device)
    model.inv_freq = rope_inv_freq(config).to(device)
    return model.eval().requires_grad_(False)


def reduced_model(
    spec: ModelSpec, dtype: str, layers: int, device: str = "cpu", parallel: Parallel | None = None
) -> Llama:
    """The recipe's model cut to its first `layers` decoder layers, the same widths, seeded weights
    made in `dtype` (never the whole model's): what autotune times a model too large to hold on."""
    config = dataclasses.replace(LlamaConfig.from_hf(spec.config), num_hidden_layers=layers)
    state = dict(seeded_tensors(config, spec.seed, torch_dtype(dtype)))
    return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)
