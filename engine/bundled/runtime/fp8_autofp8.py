"""vLLM / AutoFP8 checkpoints: `quantization_config: {"quant_method": "fp8", "activation_scheme": ...}`.

Per quantized linear (HF module name M):
    M.weight        F8_E4M3 [N, K]
    M.weight_scale  F32 scalar ([] or [1]): weight = fp8 * weight_scale
    M.input_scale   F32 scalar, when activation_scheme is "static" (else activations are scaled per token)
    M.bias          in the model dtype, when the architecture has one
Unquantized modules (lm_head, embeddings, norms, `ignored_layers`) are plain tensors.
"""

from __future__ import annotations

from prebake.artifacts.recipe.quantization import Fp8Scheme
from prebake.engine.bundled.runtime.fp8_linear import QuantLinear
from prebake.engine.bundled.runtime.fp8_source import CheckpointTensors

SCALAR = ((), (1,))


def read_linear(tensors: CheckpointTensors, module: str, scheme: Fp8Scheme) -> QuantLinear:
    weight = tensors.fp8_weight(f"{module}.weight")
    scale = tensors.scale(f"{module}.weight_scale", SCALAR).reshape(1)
    input_scale = tensors.scale(f"{module}.input_scale", SCALAR).reshape(1) if scheme.activations == "tensor" else None
    bias = tensors.get(f"{module}.bias") if tensors.has(f"{module}.bias") else None
    return QuantLinear(weight, scale, input_scale, bias)
