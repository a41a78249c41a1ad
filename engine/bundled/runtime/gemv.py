"""Decode's one-row matrix products compiled as Inductor reductions, not torch's mm: a post-grad pass
(Inductor's `post_grad_custom_post_pass`) rewrites every CPU `mm`/`addmm` whose left side has at most
MAX_ROWS rows as `sum(x[:, :, None] * w[None], -2)`, which Inductor generates as a vectorized
reduction fused with the kernels around it (RMSNorm before, SiLU-multiply and residual after), where
torch's mm was an extern MKL call and a parallel region of its own (in bf16 on AMD CPUs, MKL's
generic path). Prefill's and batched decode's products keep torch's mm. Why and measured:
docs/performance.md, "Decode: where a token's time goes".

Its version joins Inductor's cache key (the pass's uuid) and the graphs key (KEY, read by the
adapter without torch: this module imports torch only where a bake asks for the pass). An FP8
model's graphs never take it (runtime/fp8_linear owns their products).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MAX_ROWS = 1  # decode of one sequence; more rows keep torch's mm (a reduction would read each weight once a row)
VERSION = 1  # bumped when the rewrite changes: Inductor's cache key and the graphs key carry it
KEY = f"reductions of at most {MAX_ROWS} row(s), v{VERSION}"


@functools.cache
def decode_matmuls():
    """The pass, for Inductor's `post_grad_custom_post_pass`: small-row CPU mm/addmm rewritten as
    reductions. One instance a process; it pickles as this function (the compile workers')."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class DecodeMatmuls(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            _patterns().apply(graph)

        def uuid(self) -> str:
            return f"prebake decode matmuls: {KEY}"

        def __reduce__(self):
            return (decode_matmuls, ())

    return DecodeMatmuls()


def rewrites(mat1: torch.fx.Node, mat2: torch.fx.Node) -> bool:
    """Whether `mat1 @ mat2` is a CPU product of at most MAX_ROWS rows in a float dtype this pass takes."""
    import torch

    a, b = mat1.meta.get("val"), mat2.meta.get("val")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != 2 or b.dim() != 2:
        return False
    if a.device.type != "cpu" or b.device.type != "cpu" or a.dtype != b.dtype:
        return False
    if a.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    rows = a.shape[0]
    return isinstance(rows, int) and rows <= MAX_ROWS


def _product(mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    # accumulated in float32 by Inductor's reduction (its bf16/fp16 loads widen), rounded once, as mm does
    import torch

    return torch.sum(mat1[:, :, None] * mat2[None, :, :], dim=-2).to(mat1.dtype)


@functools.cache
def _patterns():
    import torch
    from torch._inductor.pattern_matcher import Arg, CallFunction, Match, PatternMatcherPass, register_graph_pattern

    aten = torch.ops.aten
    patterns = PatternMatcherPass(pass_name="prebake_decode_matmuls")

    @register_graph_pattern(CallFunction(aten.mm, Arg(), Arg()), pass_dict=patterns)
    def mm(match: Match, mat1: torch.fx.Node, mat2: torch.fx.Node) -> None:
        if rewrites(mat1, mat2):
            match.replace_by_example(_product, [mat1, mat2])

    @register_graph_pattern(CallFunction(aten.addmm, Arg(), Arg(), Arg()), pass_dict=patterns)
    def addmm(match: Match, bias: torch.fx.Node, mat1: torch.fx.Node, mat2: torch.fx.Node) -> None:
        if rewrites(mat1, mat2):
            match.replace_by_example(lambda c, a, b: _product(a, b) + c, [bias, mat1, mat2])

    return patterns
