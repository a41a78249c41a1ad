"""Decode's one-row products and one-query attention compiled as Inductor reductions, not extern calls:
a post-grad pass (Inductor's `post_grad_custom_post_pass`) rewrites every CPU `mm`/`addmm` of at most
MAX_ROWS rows as `sum(x[:, :, None] * w[None], -2)` and every CPU SDPA of one query row as `sum(q * k)`
over the cache, the mask, a softmax and `sum(p * v)` in fp32 (x and q stored once, a bf16 one in fp32);
Inductor fuses them with the kernels around them, where torch's mm and flash kernel were extern calls
(in bf16 on AMD CPUs, MKL's generic path) and the cache was copied per query head for SDPA. Prefill's
and batched decode's products and prefill's attention keep torch's kernels. Why and measured:
docs/performance.md, "Decode: where a token's time goes".

Its version joins Inductor's cache key (the pass's uuid) and the graphs key (`key`, read without
torch). FP8 graphs never take it (runtime/fp8_linear); the products of bf16 and fp32 packages for a
CPU with AMX take runtime.dot's kernel in place of the reduction.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prebake.engine.bundled.runtime import dot

if TYPE_CHECKING:
    import torch

MAX_ROWS = 1  # decode of one sequence; more rows keep torch's mm (a reduction would read each weight once a row)
VERSION = 3  # bumped when the rewrite changes: Inductor's cache key and the graphs key carry it
KEY = f"reductions of at most {MAX_ROWS} row(s) and one-query attention, v{VERSION}"


def key(dtype: str, isa_levels: Iterable[str]) -> str:
    """What the pass does to graphs of `dtype` for a CPU platform with `isa_levels`, as the graphs key
    says it: KEY, and the kernel where runtime.dot applies (its source's digest)."""
    if dot.applies(dtype, isa_levels):
        return f"{KEY}; {_KERNEL} (runtime.dot {dot.digest()})"
    return KEY


_KERNEL = f"products of at most {dot.ROWS} rows by prebake's kernel ({dot.HOW})"


def decode_matmuls(dot_products: bool = False):
    """The pass, for Inductor's `post_grad_custom_post_pass`: small-row CPU mm/addmm and one-query CPU
    SDPA rewritten as reductions; with `dot_products`, a bf16 or fp32 product as runtime.dot's op (an
    AOTInductor compile links its kernel: runtime.aoti). One instance a process per flag; it pickles
    as this function (the compile workers')."""
    return _decode_matmuls(bool(dot_products))


@functools.cache
def _decode_matmuls(dot_products: bool):
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class DecodeMatmuls(CustomGraphPass):
        links_dot = dot_products  # read by runtime.aoti's compile: the kernel's archive is linked

        def __call__(self, graph: torch.fx.Graph) -> None:
            _patterns(dot_products).apply(graph)

        def uuid(self) -> str:
            kernel = f"; {_KERNEL} ({dot.digest()})" if dot_products else ""
            return f"prebake decode matmuls: {KEY}{kernel}"

        def __reduce__(self):
            return (decode_matmuls, (dot_products,))

    return DecodeMatmuls()


def rewrites(mat1: torch.fx.Node, mat2: torch.fx.Node, max_rows: int = MAX_ROWS) -> bool:
    """Whether `mat1 @ mat2` is a CPU product of at most `max_rows` rows in a float dtype this pass takes."""
    import torch

    a, b = mat1.meta.get("val"), mat2.meta.get("val")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != 2 or b.dim() != 2:
        return False
    if a.device.type != "cpu" or b.device.type != "cpu" or a.dtype != b.dtype:
        return False
    if a.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    rows = a.shape[0]
    return isinstance(rows, int) and rows <= max_rows


def attends(query: torch.fx.Node, key: torch.fx.Node, value: torch.fx.Node, dropout: float, causal: bool) -> bool:
    """Whether an SDPA of `query` over `key`/`value` is one this pass takes: on the CPU, a float dtype,
    one query row, as many key as query heads (the model expands GQA's before it), no dropout, no
    causal flag (decode's mask is explicit)."""
    import torch

    q, k, v = (n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in (query, key, value))
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return False
    if q.dim() != 4 or not q.device.type == k.device.type == v.device.type == "cpu":
        return False
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16) or not q.dtype == k.dtype == v.dtype:
        return False
    return q.shape[2] == 1 and q.shape[:2] == k.shape[:2] == v.shape[:2] and dropout == 0.0 and not causal


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float):
    # q [B, H, 1, D], k/v [B, H, T, D], mask added, broadcast to [B, H, 1, T] (the flash kernel takes no bool
    # mask: the model's is converted to 0 / -inf before it); as that kernel, scores, mask and softmax in
    # fp32; the weighted sum of v in fp32 too (it rounds the probabilities to q's dtype first), rounded once
    import torch

    dtype = q.dtype
    q = _stored(_widened(q))  # else its RoPE is computed (and widened) again for every cached position
    scores = torch.sum(q.float() * k.float(), dim=-1, keepdim=True).transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1)
    return torch.sum(probs.transpose(-1, -2) * v.float(), dim=-2, keepdim=True).to(dtype)


def _product(mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    # accumulated in float32 by Inductor's reduction (its bf16/fp16 loads widen), rounded once, as mm does
    import torch

    left = _stored(_widened(mat1))  # else its RMSNorm is computed again for every output (49,152 for the logits)
    return torch.sum(left[:, :, None] * mat2[None, :, :], dim=-2).to(mat1.dtype)


def _dot_product(mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    # mat2 is the linear's weight transposed ([k, n] over an [n, k] tensor): the kernel reads it as
    # stored, and sums in float32, rounded once to bf16 here as mm rounds (fp32: as it is)
    return dot.op()(mat1, mat2.t()).to(mat1.dtype)


def _widened(x: torch.Tensor) -> torch.Tensor:
    # a bf16 row (a product's left side, the query) as float32, to be stored once: stored in bf16, the
    # reduction widens it again beside every weight it multiplies (docs/performance.md: the bf16 products
    # 0.67x-0.80x the time). Widened through its bits (a 16-bit shift), not x.float(): Inductor elides a
    # bf16 rounding followed by a widening, which would hand the product the unrounded value where mm is
    # handed the bf16 one. fp16 and fp32 rows stay as they are
    import torch

    if x.dtype != torch.bfloat16:
        return x
    return torch.bitwise_left_shift(x.view(torch.int16).to(torch.int32), 16).view(torch.float32)


def _stored(x: torch.Tensor) -> torch.Tensor:
    # x written to a buffer once, where Inductor would inline its pointwise producer into the reduction
    # that reads it, loading and recomputing it once per output: Inductor's prim that fixes a layout,
    # whose lowering realizes a copy (ExternKernel.require_stride_order)
    import torch
    import torch._inductor.inductor_prims  # registers torch.ops.prims.inductor_force_stride_order

    return torch.ops.prims.inductor_force_stride_order(x, x.stride())


@functools.cache
def _patterns(dot_products: bool):
    import operator
    from collections.abc import Callable

    import torch
    from torch._inductor.pattern_matcher import (
        Arg,
        CallFunction,
        CallFunctionVarArgs,
        Match,
        PatternMatcherPass,
        register_graph_pattern,
    )

    aten = torch.ops.aten
    patterns = PatternMatcherPass(pass_name="prebake_decode_matmuls")

    def product(mat1: torch.fx.Node, mat2: torch.fx.Node) -> Callable | None:
        # the kernel reads each weight once for up to dot.ROWS rows, a reduction once a row; it takes
        # bf16 and fp32 rows whose k is contiguous: x's, and a linear's weight as stored (mat2, its
        # transpose)
        if dot_products and rewrites(mat1, mat2, dot.ROWS):
            a, b = mat1.meta["val"], mat2.meta["val"]
            if a.dtype in (torch.bfloat16, torch.float32) and a.stride(1) == 1 and b.stride(0) == 1:
                return _dot_product
        return _product if rewrites(mat1, mat2) else None

    @register_graph_pattern(CallFunction(aten.mm, Arg(), Arg()), pass_dict=patterns)
    def mm(match: Match, mat1: torch.fx.Node, mat2: torch.fx.Node) -> None:
        if (multiply := product(mat1, mat2)) is not None:
            match.replace_by_example(multiply, [mat1, mat2])

    @register_graph_pattern(CallFunction(aten.addmm, Arg(), Arg(), Arg()), pass_dict=patterns)
    def addmm(match: Match, bias: torch.fx.Node, mat1: torch.fx.Node, mat2: torch.fx.Node) -> None:
        if (multiply := product(mat1, mat2)) is not None:
            match.replace_by_example(lambda c, a, b: multiply(a, b) + c, [bias, mat1, mat2])

    flash = aten._scaled_dot_product_flash_attention_for_cpu.default

    # its output, not its logsumexp: a graph that reads the logsumexp keeps the kernel (the pattern's
    # inner node has no other user)
    @register_graph_pattern(CallFunction(operator.getitem, CallFunctionVarArgs(flash), 0), pass_dict=patterns)
    def sdpa(match: Match, *args, **kwargs) -> None:
        node = match.output_node().args[0]
        assert isinstance(node, torch.fx.Node)  # the pattern's inner call
        # (query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None)
        named: dict = dict(zip([a.name for a in flash._schema.arguments], node.args)) | dict(node.kwargs)
        query, key, value = named["query"], named["key"], named["value"]
        if not attends(query, key, value, named.get("dropout_p", 0.0), named.get("is_causal", False)):
            return
        mask, scale = named.get("attn_mask"), named.get("scale")
        if scale is None:
            scale = query.meta["val"].shape[-1] ** -0.5
        if mask is None:
            match.replace_by_example(lambda q, k, v: _attention(q, k, v, None, scale), [query, key, value])
        else:
            match.replace_by_example(lambda q, k, v, m: _attention(q, k, v, m, scale), [query, key, value, mask])

    return patterns
