"""FP8 W8A8 linears: float8_e4m3fn weights with row-wise scales, activations quantized per token.

    y = _scaled_mm(quant(x) [M, K], weight.t() [K, N], scale_a [M, 1], scale_b [1, N]) + bias

`scale_a` is each row's amax / 448 at run time (dynamic, vLLM's per-token scheme) or a checkpoint's
static `input_scale` repeated over the rows. A per-tensor weight scale is served as N equal row scales:
one kernel path, exact. q/k/v and gate/up are fused as vLLM fuses them: per-tensor shards requantized
to the largest shard scale (vLLM's requantize_with_max_scale), per-channel shards stacked as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # vLLM's floor for a dynamic scale: an all-zero row stays finite


@dataclass(frozen=True)
class QuantLinear:
    """One linear as a checkpoint holds it: weight FP8 [N, K]; scale fp32 [1] (per tensor) or [N]
    (per channel), what multiplies the FP8 values back; input_scale fp32 [1] when static; bias."""

    weight: Tensor
    scale: Tensor
    input_scale: Tensor | None = None
    bias: Tensor | None = None

    @property
    def per_tensor(self) -> bool:
        return self.scale.numel() == 1

    def dequantize(self, dtype: torch.dtype) -> Tensor:
        scale = self.scale if self.per_tensor else self.scale[:, None]
        return (self.weight.float() * scale).to(dtype)


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (row) FP8 quantization of a [N, K] weight: (FP8 weight, fp32 scales [N])."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp_min(MIN_SCALE)
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def requantize_with_max_scale(shards: Sequence[QuantLinear]) -> tuple[Tensor, Tensor]:
    """Per-tensor shards as one weight under the largest of their scales (vLLM's fused q/k/v, gate/up)."""
    top = torch.stack([s.scale.reshape(()) for s in shards]).max()
    parts = [(s.weight.float() * (s.scale.reshape(()) / top)).clamp(-FP8_MAX, FP8_MAX).to(FP8) for s in shards]
    return torch.cat(parts), top.reshape(1)


def fuse(shards: Sequence[QuantLinear]) -> QuantLinear:
    """Shards of one input stacked along N (q, k, v or gate, up) as one linear."""
    if all(s.per_tensor for s in shards):
        weight, scale = requantize_with_max_scale(shards)
    else:
        weight = torch.cat([s.weight for s in shards])
        scale = torch.cat([s.scale.expand(s.weight.shape[0]) for s in shards])
    statics = [s.input_scale for s in shards if s.input_scale is not None]
    input_scale = torch.stack([i.reshape(()) for i in statics]).max().reshape(1) if statics else None
    biases = [s.bias for s in shards if s.bias is not None]
    bias = torch.cat(biases) if len(biases) == len(shards) else None
    return QuantLinear(weight, scale, input_scale, bias)


class Fp8Linear(nn.Module):
    """A W8A8 linear. Parameters (no gradients): weight [N, K] FP8, weight_scale [N] fp32, input_scale
    [1] fp32 when the scheme's activations are static, a bias in the model dtype when it has one."""

    weight: Tensor
    weight_scale: Tensor
    input_scale: Tensor | None

    def __init__(self, in_features: int, out_features: int, *, bias: bool, static: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # parameters, not buffers: AOTInductor clones every buffer at compile time (a buffer may be
        # mutated), which would read an 8B model's placeholder weights into memory
        self.weight = _frozen(torch.empty(out_features, in_features, dtype=FP8))
        self.weight_scale = _frozen(torch.empty(out_features, dtype=torch.float32))
        self.input_scale = _frozen(torch.empty(1, dtype=torch.float32)) if static else None
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.input_scale is None:
            scale = (rows.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp_min(MIN_SCALE)
        else:
            scale = self.input_scale.expand(rows.shape[0], 1).contiguous()
        quantized = (rows.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        out = torch._scaled_mm(
            quantized,
            self.weight.t(),
            scale_a=scale,
            scale_b=self.weight_scale[None, :],
            bias=self.bias,
            out_dtype=x.dtype,
        )
        return out.reshape(*x.shape[:-1], self.out_features)

    @staticmethod
    def state_of(linear: QuantLinear, dtype: torch.dtype) -> dict[str, Tensor]:
        """The module's state dict (relative names) for a checkpoint's linear."""
        n = linear.weight.shape[0]
        state = {"weight": linear.weight.contiguous(), "weight_scale": linear.scale.float().expand(n).contiguous()}
        if linear.input_scale is not None:
            state["input_scale"] = linear.input_scale.float().reshape(1)
        if linear.bias is not None:
            state["bias"] = linear.bias.to(dtype)
        return state


def _frozen(tensor: Tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


def is_fp8(model: nn.Module) -> bool:
    """Whether `model` holds any FP8 linear."""
    return any(isinstance(m, Fp8Linear) for m in model.modules())
