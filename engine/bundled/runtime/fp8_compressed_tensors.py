"""compressed-tensors checkpoints (llm-compressor's FP8, FP8_DYNAMIC): `quantization_config:
{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {one group},
"ignore": [...]}`.

Per quantized linear (HF module name M; modules matching `ignore`, names or `re:` patterns, are plain):
    M.weight        F8_E4M3 [N, K]
    M.weight_scale  strategy "channel": [N, 1]; strategy "tensor": [1] or []; in F32 or the model
                    dtype (upcast here): weight = fp8 * weight_scale
    M.input_scale   [1], when input_activations are static (FP8); absent when dynamic (FP8_DYNAMIC,
                    per token)
    M.weight_zero_point / M.input_zero_point   all zero for float formats; not read
Strategy "block" (FP8_BLOCK) is read by block_fp8, which dequantizes it.
"""

from __future__ import annotations

from prebake.artifacts.recipe.quantization import Fp8Scheme
from prebake.engine.bundled.runtime.fp8_linear import QuantLinear
from prebake.engine.bundled.runtime.fp8_source import CheckpointTensors

SCALAR = ((), (1,))


def read_linear(tensors: CheckpointTensors, module: str, scheme: Fp8Scheme) -> QuantLinear:
    weight = tensors.fp8_weight(f"{module}.weight")
    n = weight.shape[0]
    shapes = ((n, 1), (n,)) if scheme.weights == "channel" else SCALAR
    scale = tensors.scale(f"{module}.weight_scale", shapes).reshape(-1)
    input_scale = tensors.scale(f"{module}.input_scale", SCALAR).reshape(1) if scheme.activations == "tensor" else None
    bias = tensors.get(f"{module}.bias") if tensors.has(f"{module}.bias") else None
    return QuantLinear(weight, scale, input_scale, bias)
