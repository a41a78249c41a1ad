"""Whether FP8 is fast here: on a CPU without FP8 units torch emulates `_scaled_mm` (both operands
converted, then a wider matmul), so an FP8 model serves slower than bf16; the bake says so once, with
the factor measured on one decode-shaped linear of the model's widths. Whether it is emulated is
measured too (engine/common/fp8_units: no CPU flag says it, AMX's included).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from prebake.engine.bundled.runtime.fp8_linear import Fp8Linear, QuantLinear, quantize_rows
from prebake.engine.bundled.runtime.weights import LlamaConfig
from prebake.engine.common.fp8_units import fp8_emulated, median_time


def decode_slowdown(hidden: int, out: int, repeats: int = 5) -> float:
    """FP8 over bf16 time of one decode step's [1, hidden] x [hidden, out] linear, medians of `repeats`."""
    weight = torch.randn(out, hidden) * hidden**-0.5
    x = torch.randn(1, hidden, dtype=torch.bfloat16)
    plain = nn.Linear(hidden, out, bias=False, dtype=torch.bfloat16)
    plain.weight.data = weight.to(torch.bfloat16)
    fp8 = Fp8Linear(hidden, out, bias=False, static=False, dtype=torch.bfloat16)
    fp8.load_state_dict(Fp8Linear.state_of(QuantLinear(*quantize_rows(weight)), torch.bfloat16))
    with torch.no_grad():
        return median_time(lambda: fp8(x), repeats) / median_time(lambda: plain(x), repeats)


def warn_if_emulated(config: LlamaConfig, log: Callable[[str], None] = print) -> float | None:
    """On a CPU that emulates FP8: one warning line with the measured FP8 / bf16 decode factor (returned)."""
    if not fp8_emulated():
        return None
    factor = decode_slowdown(config.hidden_size, config.intermediate_size)
    log(
        f"warning: this CPU has no FP8 matmul units, so torch emulates FP8 matmuls: a decode-shaped linear "
        f"({config.hidden_size} -> {config.intermediate_size}) runs {factor:.1f}x slower in FP8 than in bf16. "
        f"FP8 here is a correctness target; serve bf16 for speed (an FP8 checkpoint served at bf16 is "
        f"dequantized at load)"
    )
    return factor
