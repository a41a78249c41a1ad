"""Loading a recipe's model: seeded random weights, a random checkpoint written once, a GGUF file
dequantized once into a folder (gguf_folder), or a Hugging Face folder; and the two models a bake
makes without them: placeholders (storage reserved, never touched: a compile that keeps weights out
of its output) and a copy cut to a few layers (autotune's timings)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from prebake.artifacts.errors import BuildError, CheckpointError, RecipeError
from prebake.artifacts.extras import require
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
from prebake.engine.bundled.runtime.gguf_folder import gguf_folder, gguf_folder_path
from prebake.engine.bundled.runtime.model import Llama, SkipInit, build_model, rope_inv_freq
from prebake.engine.bundled.runtime.parallel import Parallel, local_config
from prebake.engine.bundled.runtime.weights import (
    CONFIG_FILE,
    LlamaConfig,
    load_hf_folder,
    read_config,
    tiny_random_weights,
)

# fp8: the model dtype of an FP8 model (its activations, norms, embeddings, KV cache); its linears are FP8
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
# What a config.json may hold beside the recipe's without changing the computation: the tokens
# that start and end a sequence (left out of the key for the same reason).
_NOT_COMPARED = ("bos_token_id", "eos_token_ids")


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise BuildError(f"dtype {name!r} has no runtime in the bundled engine (it runs {sorted(TORCH_DTYPES)})")
    return TORCH_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The recipe's name of a model dtype (an FP8 model's is bf16's: ask is_fp8 first); torch's own
    name for one the bundled engine does not run."""
    return next((name for name, value in TORCH_DTYPES.items() if value == dtype), str(dtype))


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
    `home` ($PREBAKE_HOME; written on first need) or its folder, all read by mmap. At dtype fp8 an
    FP8 model (runtime/fp8_load)."""
    if dtype == "fp8":
        return fp8_model(spec, device, home, log)
    if spec.weights == RANDOM_WEIGHTS:
        config = recipe_config(spec)
        state = tiny_random_weights(config, seed=spec.seed)  # made on the CPU: the same bits on any machine
        return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)
    if spec.weights == RANDOM_CHECKPOINT:
        folder = random_checkpoint(spec, home or default_home(), log=log).folder
    elif spec.gguf is not None:
        require("gguf", f"weights {spec.weights!r}")
        folder = gguf_folder(spec, torch_dtype(dtype), home or default_home(), log=log)
    else:
        folder = Path(spec.weights).expanduser()
        check_folder_config(spec, folder)  # before a byte of the weights is read
    try:
        config, state = _plain_weights(folder, dtype, log)
    except CheckpointError as exc:
        if spec.weights == RANDOM_CHECKPOINT:
            exc.add_note(
                f"{folder} is prebake's random checkpoint: delete the folder and the next start writes it again"
            )
        raise
    return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)


def recipe_config(spec: ModelSpec) -> LlamaConfig:
    """The recipe's [model.config] as the runtime's config; one it cannot run is the recipe's error."""
    try:
        return LlamaConfig.from_hf(spec.config)
    except (ValueError, TypeError, KeyError) as exc:
        raise RecipeError(f"recipe {spec.name!r} [model.config]: {exc!s}; fix the recipe's config") from None


def check_folder_config(spec: ModelSpec, folder: Path) -> None:
    """Refuse a model folder whose config.json describes another model than the recipe's [model.config].

    The recipe's config is authoritative: the bake compiled the graphs for it, and every bundle's key
    holds its digest; the folder's config.json must describe the same computation, field by field
    (the tokens that start and end a sequence aside), and the weights must then match config.json."""
    ours, theirs = recipe_config(spec), read_config(folder)
    differ = [
        f"{f.name}: the recipe says {getattr(ours, f.name)!r}, {CONFIG_FILE} says {getattr(theirs, f.name)!r}"
        for f in dataclasses.fields(LlamaConfig)
        if f.name not in _NOT_COMPARED and getattr(ours, f.name) != getattr(theirs, f.name)
    ]
    if differ:
        raise CheckpointError(
            f"{folder / CONFIG_FILE} describes another model than recipe {spec.name!r}'s [model.config] "
            f"({'; '.join(differ)}). The recipe's config is the one its graphs were compiled and keyed for: point "
            f"weights at the folder of that model, or, if this folder is the model you meant, copy its config.json's "
            f"fields into the recipe's [model.config] and bake again (the key changes)"
        )


def model_folder(spec: ModelSpec, dtype: str, home: Path | None = None) -> Path | None:
    """The Hugging Face folder a start of `spec` in `dtype` reads (its tokenizer and chat template
    too): the user's folder, the GGUF's dequantized one; None for seeded random weights."""
    if spec.random_weights:
        return None
    if spec.gguf is not None:
        return gguf_folder_path(spec, torch_dtype(dtype), home or default_home())
    return Path(spec.weights).expanduser()


def _plain_weights(folder: Path, dtype: str, log) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """A folder's weights in `dtype`: an FP8 checkpoint served at a plain precision dequantized."""
    scheme = read_scheme(folder)
    if scheme is None:
        return load_hf_folder(folder, torch_dtype(dtype))
    log(
        f"{folder} is an FP8 checkpoint ({scheme.format}, {scheme.weights} scales) served at {dtype}: "
        f"dequantized at load, it serves at {dtype} speed"
    )
    config, weights = read_fp8_folder(folder, scheme, torch_dtype(dtype))
    return config, dequantized(config, weights, torch_dtype(dtype))


def fp8_model(spec: ModelSpec, device: str = "cpu", home: Path | None = None, log=print) -> Llama:
    """The recipe's model with FP8 linears: its FP8 checkpoint read in its format, a plain one (a
    folder, a GGUF's dequantized folder, or seeded weights) quantized on load, a random checkpoint
    written once in FP8."""
    scheme, dtype = scheme_of(spec), torch_dtype("fp8")
    if spec.weights == RANDOM_WEIGHTS:
        config = recipe_config(spec)
        weights = quantize_on_load(config, tiny_random_weights(config, seed=spec.seed), scheme)
        return build_fp8_model(config, weights, scheme, dtype, device)
    if spec.weights == RANDOM_CHECKPOINT:
        folder = random_checkpoint(spec, home or default_home(), log=log, fp8=True).folder
    elif spec.gguf is not None:
        require("gguf", f"weights {spec.weights!r}")
        folder = gguf_folder(spec, dtype, home or default_home(), log=log)
    else:
        folder = Path(spec.weights).expanduser()
        check_folder_config(spec, folder)
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
    config = recipe_config(spec)
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
    made in `dtype` (never the whole model's): what autotune times a model too large to hold on.
    Its head is tied to its embeddings: the logits' matmul has the same shape and cost, and one
    [vocab, hidden] matrix is held, not two (llama3-8b: 1.05 GB less, the fp8 bake's peak under 4 GB)."""
    config = dataclasses.replace(recipe_config(spec), num_hidden_layers=layers, tie_word_embeddings=True)
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
