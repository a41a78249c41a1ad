"""FP8 schemes: what an FP8 checkpoint's config says, read as JSON (no torch), for the graphs key.

    <folder>/config.json            quantization_config: {"quant_method": "fp8", ...}   vLLM / AutoFP8, block FP8
                                    quantization_config: {"quant_method": "compressed-tensors", ...}
    <folder>/hf_quant_config.json   {"quantization": {"quant_algo": "FP8", "exclude_modules": [...]}}   ModelOpt

A scheme is what the compiled graphs depend on: the checkpoint's format, its weight granularity
("tensor", "channel" or "block"), its activation scheme ("token": dynamic per-token scales, "tensor":
a static `input_scale`) and the modules it leaves unquantized. A folder without any of these is a
plain checkpoint: at precision fp8 it is quantized on load (`QUANTIZE_ON_LOAD`, vLLM's
`--quantization fp8` with per-channel weights). The tensors are read by the engine's loaders
(prebake.engine.bundled.runtime.fp8_*: one module per format); docs/fp8.md lists them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prebake.artifacts.errors import CheckpointError
from prebake.artifacts.recipe.schema import RANDOM_CHECKPOINT, RANDOM_WEIGHTS, ModelSpec

CONFIG_FILE = "config.json"
MODELOPT_FILE = "hf_quant_config.json"
FORMATS = ("autofp8", "compressed-tensors", "block-fp8", "modelopt", "quantize-on-load")
GRANULARITIES = ("tensor", "channel", "block")
ACTIVATIONS = ("token", "tensor")
DEFAULT_EXCLUDED = ("lm_head",)  # what every format leaves in the model dtype unless told otherwise


class QuantizationError(CheckpointError):
    """An FP8 checkpoint's config or tensors are malformed or of a kind prebake does not read (the
    user's file, as every CheckpointError)."""


@dataclass(frozen=True)
class Fp8Scheme:
    """How a checkpoint's linears are quantized. `block` is the block size of block FP8 ((128, 128))."""

    format: str
    weights: str
    activations: str
    excluded: tuple[str, ...] = DEFAULT_EXCLUDED
    block: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS or self.weights not in GRANULARITIES or self.activations not in ACTIVATIONS:
            raise QuantizationError(
                f"FP8 scheme ({self.format}, weights {self.weights}, activations {self.activations}) is not one "
                f"of formats {FORMATS}, weights {GRANULARITIES}, activations {ACTIVATIONS}"
            )
        if (self.weights == "block") != (self.block is not None):
            raise QuantizationError("a block FP8 scheme needs its weight_block_size, and only it has one")

    def factors(self) -> dict[str, str]:
        """The scheme as key factors (the graphs key's `quantization` group)."""
        factors = {
            "format": self.format,
            "weights": self.weights,
            "activations": self.activations,
            "excluded": ",".join(sorted(self.excluded)),
        }
        if self.block is not None:
            factors["block"] = f"{self.block[0]}x{self.block[1]}"
        return factors

    def excludes(self, module: str) -> bool:
        """Whether `module` (an HF name, `model.layers.0.mlp.down_proj` or `lm_head`) stays unquantized."""
        return any(_matches(pattern, module) for pattern in self.excluded)


QUANTIZE_ON_LOAD = Fp8Scheme(format="quantize-on-load", weights="channel", activations="token")


def read_scheme(folder: Path) -> Fp8Scheme | None:
    """The FP8 scheme of a Hugging Face folder's checkpoint; None for a plain (unquantized) one."""
    modelopt = folder / MODELOPT_FILE
    if modelopt.is_file():
        return _modelopt(_json(modelopt))
    config = folder / CONFIG_FILE
    if not config.is_file():
        return None
    quant = _json(config).get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise QuantizationError(f"{config}: quantization_config is not a table; fix or remove it")
    return scheme_from_config(quant, str(config))


def scheme_from_config(quant: Mapping[str, Any], where: str) -> Fp8Scheme:
    """A config.json's quantization_config as a scheme, or QuantizationError naming what is not read."""
    method = quant.get("quant_method")
    if method == "fp8":
        return _autofp8(quant, where)
    if method == "compressed-tensors":
        return _compressed_tensors(quant, where)
    raise QuantizationError(
        f"{where}: quant_method {method!r} is not an FP8 format prebake reads "
        f"('fp8', 'compressed-tensors', or ModelOpt's {MODELOPT_FILE}); use an FP8 or a bf16 checkpoint"
    )


def _autofp8(quant: Mapping[str, Any], where: str) -> Fp8Scheme:
    activations = {"dynamic": "token", "static": "tensor"}.get(quant.get("activation_scheme", "dynamic"))
    if activations is None:
        raise QuantizationError(f"{where}: activation_scheme {quant['activation_scheme']!r} is not dynamic or static")
    excluded = tuple(quant.get("ignored_layers") or quant.get("modules_to_not_convert") or DEFAULT_EXCLUDED)
    block = quant.get("weight_block_size")
    if block is None:
        return Fp8Scheme("autofp8", "tensor", activations, excluded)
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise QuantizationError(f"{where}: weight_block_size {block!r} is not two positive integers like [128, 128]")
    return Fp8Scheme("block-fp8", "block", "token", excluded, (block[0], block[1]))


def _compressed_tensors(quant: Mapping[str, Any], where: str) -> Fp8Scheme:
    if quant.get("format") not in ("float-quantized", "naive-quantized"):
        raise QuantizationError(
            f"{where}: compressed-tensors format {quant.get('format')!r} is not float-quantized; prebake reads "
            f"FP8 (llm-compressor's FP8, FP8_DYNAMIC, FP8_BLOCK), not int or packed formats"
        )
    groups = list((quant.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise QuantizationError(f"{where}: {len(groups)} config_groups; prebake reads one FP8 group")
    weights, acts = groups[0].get("weights") or {}, groups[0].get("input_activations")
    if weights.get("type") != "float" or weights.get("num_bits") != 8:
        raise QuantizationError(f"{where}: weights are {weights.get('type')} {weights.get('num_bits')}-bit, not FP8")
    strategy = weights.get("strategy")
    if strategy not in GRANULARITIES:
        raise QuantizationError(f"{where}: weight strategy {strategy!r} is not tensor, channel or block")
    activations = "token" if acts is None or acts.get("dynamic", False) else "tensor"
    excluded = tuple(quant.get("ignore") or ())
    shape = weights.get("block_structure") or []
    if strategy == "block" and len(shape) != 2:
        raise QuantizationError(f"{where}: block strategy without a block_structure of two sizes ({shape!r})")
    block = (int(shape[0]), int(shape[1])) if strategy == "block" else None
    return Fp8Scheme("compressed-tensors", strategy, activations, excluded, block)


def _modelopt(document: Mapping[str, Any]) -> Fp8Scheme:
    quant = document.get("quantization") or {}
    if quant.get("quant_algo") != "FP8":
        raise QuantizationError(
            f"{MODELOPT_FILE}: quant_algo {quant.get('quant_algo')!r} is not FP8; prebake reads ModelOpt's FP8 only"
        )
    return Fp8Scheme("modelopt", "tensor", "tensor", tuple(quant.get("exclude_modules") or ()))


def _matches(pattern: str, module: str) -> bool:
    """compressed-tensors' `re:` patterns, ModelOpt's `*` globs, or a name (a suffix of the module's)."""
    import fnmatch
    import re

    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    if "*" in pattern:
        return fnmatch.fnmatch(module, pattern)
    return module == pattern or module.endswith("." + pattern)


def _json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise QuantizationError(f"{path} cannot be read as JSON ({exc}); download it again") from exc
    if not isinstance(document, dict):
        raise QuantizationError(f"{path} is not a JSON object; download it again")
    return document


RANDOM_FP8 = Fp8Scheme(format="compressed-tensors", weights="channel", activations="token", excluded=DEFAULT_EXCLUDED)


def scheme_of(spec: ModelSpec) -> Fp8Scheme:
    """The scheme a recipe's weights are served in at precision fp8: a folder's own (or quantized on load
    when it is a plain checkpoint), a random checkpoint's (written in FP8, `RANDOM_FP8`), or seeded
    weights quantized on load."""
    if spec.weights == RANDOM_CHECKPOINT:
        return RANDOM_FP8
    if spec.weights == RANDOM_WEIGHTS:
        return QUANTIZE_ON_LOAD
    return read_scheme(Path(spec.weights).expanduser()) or QUANTIZE_ON_LOAD
