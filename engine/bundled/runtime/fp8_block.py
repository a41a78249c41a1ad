"""Block FP8 checkpoints (DeepSeek-V3, Qwen3-*-FP8): `quantization_config: {"quant_method": "fp8",
"weight_block_size": [bn, bk]}`, and compressed-tensors' FP8_BLOCK (strategy "block").

Per quantized linear (HF module name M):
    M.weight            F8_E4M3 [N, K]
    M.weight_scale_inv  F32 [ceil(N / bn), ceil(K / bk)] (compressed-tensors names it weight_scale):
                        weight[i, j] = fp8[i, j] * scale[i // bn, j // bk]
Activations are quantized per token per bk channels by the checkpoint's own engines. No platform
prebake serves has a block kernel, so the weight is dequantized here, once, into the model dtype,
and the linear serves as a plain one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from prebake.artifacts.recipe.quantization import Fp8Scheme
from prebake.engine.bundled.runtime.fp8_source import CheckpointTensors


def read_linear(tensors: CheckpointTensors, module: str, scheme: Fp8Scheme, dtype: torch.dtype) -> Tensor:
    assert scheme.block is not None  # Fp8Scheme holds a block exactly when its weights are "block"
    weight = tensors.fp8_weight(f"{module}.weight")
    bn, bk = scheme.block
    grid = (math.ceil(weight.shape[0] / bn), math.ceil(weight.shape[1] / bk))
    name = f"{module}.weight_scale" if scheme.format == "compressed-tensors" else f"{module}.weight_scale_inv"
    return dequantize_blocks(weight, tensors.scale(name, (grid,)), scheme.block, dtype)


def dequantize_blocks(weight: Tensor, scale: Tensor, block: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """An FP8 [N, K] weight times its [ceil(N/bn), ceil(K/bk)] block scales, in `dtype`."""
    n, k = weight.shape
    full = scale.repeat_interleave(block[0], dim=0)[:n].repeat_interleave(block[1], dim=1)[:, :k]
    return (weight.float() * full).to(dtype)
