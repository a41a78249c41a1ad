"""Loading a recipe's model: seeded random weights, a random checkpoint written once, or a Hugging Face
folder; and the two models a bake makes without them: placeholders (storage reserved, never touched: a
compile that keeps weights out of its output) and a copy cut to a few layers (autotune's timings)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from prebake.artifacts.errors import BuildError
from prebake.artifacts.recipe.quantization import read_scheme, scheme_of
from prebake.artifacts.recipe.schema import RANDOM_CHECKPOINT, RANDOM_WEIGHTS, ModelSpec
from prebake.artifacts.store.settings import default_home
from prebake.engine.bundled.runtime.checkpoint import random_checkpoint, seeded_tensors
from prebake.engine.bundled.runtime.fp8_load import (
    build_fp8_model,
    dequantized,
    fp8_skeleton,
    quantize_on_load,
    read_fp8_folder,
)
from prebake.engine.bundled.runtime.model import Llama, SkipInit, build_model, rope_inv_freq
from prebake.engine.bundled.runtime.parallel import Parallel, local_config
from prebake.engine.bundled.runtime.weights import LlamaConfig, load_hf_folder, tiny_random_weights

# fp8: the model dtype of an FP8 model (its activations, norms, embeddings, KV cache); its linears are FP8
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise BuildError(f"dtype {name!r} has no runtime in the bundled engine (it runs {sorted(TORCH_DTYPES)})")
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
    inline config with seeded weights, its random checkpoint under `home` ($PREBAKE_HOME; written on
    first need) or its folder, both read by mmap. At dtype fp8 an FP8 model (runtime/fp8_load)."""
    if dtype == "fp8":
        return fp8_model(spec, device, home, log)
    if spec.weights == RANDOM_WEIGHTS:
        config = LlamaConfig.from_hf(spec.config)
        state = tiny_random_weights(config, seed=spec.seed)  # made on the CPU: the same bits on any machine
        return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)
    if spec.weights == RANDOM_CHECKPOINT:
        folder = random_checkpoint(spec, home or default_home(), log=log).folder
    else:
        folder = Path(spec.weights).expanduser()
    scheme = read_scheme(folder)
    if scheme is not None:  # an FP8 checkpoint served at a plain precision
        log(
            f"{folder} is an FP8 checkpoint ({scheme.format}, {scheme.weights} scales) served at {dtype}: "
            f"dequantized at load, it serves at {dtype} speed"
        )
        config, weights = read_fp8_folder(folder, scheme, torch_dtype(dtype))
        state = dequantized(config, weights, torch_dtype(dtype))
    else:
        config, state = load_hf_folder(folder, torch_dtype(dtype))
    return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)


def fp8_model(spec: ModelSpec, device: str = "cpu", home: Path | None = None, log=print) -> Llama:
    """The recipe's model with FP8 linears: its FP8 checkpoint read in its format, a plain one (or seeded
    weights) quantized on load, a random checkpoint written once in FP8."""
    scheme, dtype = scheme_of(spec), torch_dtype("fp8")
    if spec.weights == RANDOM_WEIGHTS:
        config = LlamaConfig.from_hf(spec.config)
        weights = quantize_on_load(config, tiny_random_weights(config, seed=spec.seed), scheme)
        return build_fp8_model(config, weights, scheme, dtype, device)
    if spec.weights == RANDOM_CHECKPOINT:
        folder = random_checkpoint(spec, home or default_home(), log=log, fp8=True).folder
    else:
        folder = Path(spec.weights).expanduser()
    if read_scheme(folder) is None:
        log(f"{folder} holds no FP8 weights: quantized on load (per-channel weight scales, per-token activations)")
        config, state = load_hf_folder(folder, dtype)
        weights = quantize_on_load(config, state, scheme)
    else:
        config, weights = read_fp8_folder(folder, scheme, dtype)
    return build_fp8_model(config, weights, scheme, dtype, device)


def placeholder_model(spec: ModelSpec, dtype: str, device: str = "cpu", parallel: Parallel | None = None) -> Llama:
    """The recipe's model (one rank's shard with `parallel`) whose tensors have storage that is
    reserved and never written or read.

    What a compile needs that keeps the weights out of what it writes (an AOTInductor package binds
    them at load): their shapes, dtypes and distinct storages. The pages of an allocation nobody
    touches are never made resident, so the bake's memory does not grow with the weights. (Fake
    tensors would not do: Inductor dedupes constants by storage pointer, and every fake's is 0.)"""
    config = LlamaConfig.from_hf(spec.config)
    if dtype == "fp8":
        _one_process_fp8(parallel)
        model = fp8_skeleton(config, scheme_of(spec), torch_dtype(dtype))
    else:
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
    if dtype == "fp8":  # the scheme's kernels on seeded weights quantized here (a static scheme: unit input scales)
        _one_process_fp8(parallel)
        scheme = scheme_of(spec)
        weights = quantize_on_load(config, state, scheme, static_input_scale=1.0)
        return build_fp8_model(config, weights, scheme, torch_dtype(dtype), device)
    return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)


def _one_process_fp8(parallel: Parallel | None) -> None:
    if parallel is not None:
        raise BuildError("the bundled engine serves fp8 in one process (tp 1); bake fp8 at tp 1")
