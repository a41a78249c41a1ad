"""Whether this CPU runs torch's FP8 matmul (`torch._scaled_mm`) on FP8 units: timed, since no CPU
flag says so. Without them torch emulates it, slower than bf16, and AMX is not enough (docs/fp8.md:
the factors measured on this project's AMD EPYC without AMX and its Intel Xeon with AMX). One small
decode-shaped matmul is timed, FP8 against bf16, once a process (about 0.1 s where emulated); torch
is imported then, never at this module's import.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

EMULATED_ABOVE = 2.0  # FP8 / bf16 time above which FP8 matmuls are taken to be emulated
_SHAPE = (512, 2048)  # [1, in] x [in, out]: a decode step's linear, small enough to time in 0.1 s emulated


@functools.cache
def fp8_matmul_slowdown() -> float:
    """FP8 `_scaled_mm` over bf16 matmul time for one small decode-shaped linear on this CPU (medians of 3)."""
    import torch

    width, out = _SHAPE
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out, width, generator=generator) * width**-0.5
    x = torch.randn(1, width, generator=generator)
    weight_bf16, x_bf16 = weight.to(torch.bfloat16), x.to(torch.bfloat16)
    weight_fp8, x_fp8 = weight.to(torch.float8_e4m3fn), x.to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32)
    with torch.no_grad():
        fp8 = median_time(
            lambda: torch._scaled_mm(x_fp8, weight_fp8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        )
        bf16 = median_time(lambda: x_bf16 @ weight_bf16.t())
    return fp8 / bf16


def fp8_emulated() -> bool:
    """Whether FP8 matmuls run emulated on this CPU (more than EMULATED_ABOVE times bf16's time)."""
    return fp8_matmul_slowdown() > EMULATED_ABOVE


def median_time(call: Callable[[], object], repeats: int = 3) -> float:
    """The median seconds of `repeats` calls, after one untimed."""
    call()  # first-call allocations out of the timing
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]
