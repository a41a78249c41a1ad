"""NVIDIA ModelOpt FP8 checkpoints: `hf_quant_config.json` {"quantization": {"quant_algo": "FP8",
"exclude_modules": [...]}} beside a config.json without a quantization_config of its own.

Per quantized linear (HF module name M; the modules matching `exclude_modules` globs are plain):
    M.weight        F8_E4M3 [N, K]
    M.weight_scale  F32 scalar: weight = fp8 * weight_scale
    M.input_scale   F32 scalar: activations are static per tensor (ModelOpt calibrates them)
    M.bias          in the model dtype, when the architecture has one
(`k_scale` / `v_scale` of an FP8 KV cache, when present, are not read: the KV cache stays in bf16.)
"""

from __future__ import annotations

from prebake.artifacts.recipe.quantization import Fp8Scheme
from prebake.engine.bundled.runtime.fp8_linear import QuantLinear
from prebake.engine.bundled.runtime.fp8_source import CheckpointTensors

SCALAR = ((), (1,))


def read_linear(tensors: CheckpointTensors, module: str, scheme: Fp8Scheme) -> QuantLinear:
    weight = tensors.fp8_weight(f"{module}.weight")
    scale = tensors.scale(f"{module}.weight_scale", SCALAR).reshape(1)
    input_scale = tensors.scale(f"{module}.input_scale", SCALAR).reshape(1)
    bias = tensors.get(f"{module}.bias") if tensors.has(f"{module}.bias") else None
    return QuantLinear(weight, scale, input_scale, bias)
