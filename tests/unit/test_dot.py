"""Decode's bf16 and fp32 products by prebake's kernel (runtime.dot): where the kernel applies and how
the graphs key says so, that the pass writes its op for bf16 and fp32 products of at most its rows
only, that an AOTInductor package links it and answers as the product in float32 (on a CPU with
AVX512-BF16; elsewhere that test is skipped, and the rest still runs), and that a host without the
flag refuses such a package."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from prebake.artifacts.recipe.kinds import target_keys
from prebake.artifacts.recipe.schema import Recipe, Target, load_recipe
from prebake.engine.adapters import kinds_for
from prebake.engine.bundled.runtime import aoti, dot, gemv
from prebake.engine.common.cpu import cpu_flags
from prebake.engine.common.probe import Host, Platform
from tests.support.hosts import cpu_host

AMX = "amx,avx2,avx512"


def _decode_matmuls(recipe: Recipe, dtype: str, isa: str) -> str:
    # this host's software, the CPU platform given: the key is computed as a probe there would
    host = Host(Platform("cpu", "x86_64", "", 1, tuple(isa.split(","))), cpu_host().software)
    target = Target(recipe.model.name, "cpu", 1, dtype)
    plan = target_keys(recipe, target, host, kinds_for(recipe, target))
    return dict(dict(plan.keys["graphs"].groups)["options"])["decode_matmuls"]


def test_the_kernel_applies_to_bf16_and_fp32_graphs_of_a_cpu_with_amx_only():
    assert dot.applies("bf16", AMX.split(",")) and dot.applies("fp32", AMX.split(","))
    assert not dot.applies("fp16", AMX.split(",")) and not dot.applies("fp8", AMX.split(","))
    assert not dot.applies("bf16", ["avx2", "avx512"])  # AVX-512 with or without BF16: one key
    assert not dot.applies("fp32", ["avx2", "avx512"])  # measured on AMX CPUs only


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_graphs_key_names_the_kernel_for_a_package_of_a_cpu_with_amx(dtype: str):
    recipe = load_recipe("tiny-llama")
    with_kernel = _decode_matmuls(recipe, dtype, AMX)
    assert with_kernel.startswith(gemv.KEY) and f"runtime.dot {dot.digest()}" in with_kernel
    assert _decode_matmuls(recipe, dtype, "avx2,avx512") == gemv.KEY
    in_process = recipe.model_copy(update={"compile": recipe.compile.model_copy(update={"variant": "inductor-cache"})})
    assert _decode_matmuls(in_process, dtype, AMX) == gemv.KEY  # torch.compile's graphs keep the reductions


def test_an_edited_kernel_is_a_new_key(tmp_path, monkeypatch):
    edited = tmp_path / "dot.cpp"
    edited.write_bytes(dot.SOURCE.read_bytes() + b"// edited\n")
    before = gemv.key("bf16", AMX.split(","))
    monkeypatch.setattr(dot, "SOURCE", edited)
    dot.digest.cache_clear()
    try:
        assert gemv.key("bf16", AMX.split(",")) != before
    finally:
        monkeypatch.undo()
        dot.digest.cache_clear()


@pytest.mark.parametrize(
    ("rows", "dtype", "kernel", "mm"),
    [
        (1, torch.bfloat16, True, False),
        (dot.ROWS, torch.bfloat16, True, False),  # two sequences' decode: each weight read once
        (dot.ROWS + 1, torch.bfloat16, False, True),  # more rows keep torch's mm
        (1, torch.float32, True, False),
        (dot.ROWS, torch.float32, True, False),
        (dot.ROWS + 1, torch.float32, False, True),
        (1, torch.float16, False, False),  # not the kernel's: a reduction
    ],
)
@pytest.mark.parametrize("stored", ["[n, k]", "[k, n]"])  # a linear's weight, and a product with k strided
def test_the_pass_writes_the_kernels_op_for_products_of_at_most_its_rows(rows, dtype, kernel, mm, stored):
    from torch._guards import detect_fake_mode
    from torch._inductor.virtualized import V

    gen = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 40, generator=gen).to(dtype), torch.randn(13, 40, generator=gen).to(dtype)
    if stored == "[k, n]":  # the kernel reads rows of contiguous k: this one is a reduction, or mm, still
        w, kernel, mm = w.t().contiguous().t(), False, rows > gemv.MAX_ROWS
    module = make_fx(lambda a, b: torch.mm(a, b.t()), tracing_mode="fake")(x, w)
    with V.set_fake_mode(detect_fake_mode([n.meta["val"] for n in module.graph.nodes if "val" in n.meta])):
        gemv.decode_matmuls(dot_products=True)(module.graph)
    module.recompile()
    calls = {str(n.target) for n in module.graph.nodes if n.op == "call_function"}
    assert (str(dot.op()) in calls) is kernel
    assert ("aten.mm.default" in calls) is mm
    # the kernel: the op's Python body (tracing, an eager call), the product in float32 rounded once; a
    # reduction: the same sum in another order (fp16's products each rounded to fp16 in this eager run)
    near = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-5, 2**-7), torch.float16: (2e-2, 2**-10)}[dtype]
    exact = {"atol": 0, "rtol": 0} if kernel else dict(zip(("atol", "rtol"), near))
    torch.testing.assert_close(module(x, w), torch.mm(x.float(), w.float().t()).to(dtype), **exact)


def test_the_pass_with_and_without_the_kernel_are_two_instances_that_pickle_as_themselves():
    import pickle

    on, off = gemv.decode_matmuls(dot_products=True), gemv.decode_matmuls()
    assert on is not off and on.uuid() != off.uuid()
    assert pickle.loads(pickle.dumps(on)) is on and pickle.loads(pickle.dumps(off)) is off
    assert aoti.package_options(dot_products=True)["post_grad_custom_post_pass"] is on


def test_a_package_with_the_kernel_is_refused_where_the_cpu_lacks_avx512_bf16():
    recorded = aoti.PackageRecord(torch=torch.__version__, cpu_isa=f"AVX512 {dot.ISA}")
    flags = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
    reason = aoti.platform_problem(recorded, device="cpu", flags=flags)
    assert reason == f"its kernels were built for vector ISA {dot.ISA} and this CPU lacks avx512_bf16"
    assert aoti.platform_problem(recorded, device="cpu", flags=flags | {"avx512_bf16"}) is None


class _Linear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight) * 2  # an epilogue Inductor fuses after the kernel


@pytest.mark.skipif(not dot.FLAGS.issubset(cpu_flags()), reason="this CPU lacks AVX512-BF16: the kernel cannot run")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_package_links_the_kernel_and_answers_as_the_product_in_float32(rows: int, dtype, tmp_path: Path):
    # k = 72: whole lines (two of bf16's 32 lanes, four of fp32's 16) and a masked tail; n = 13: one block
    # of eight rows and a short one; one row of x, and two (each weight load shared by both)
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(13, 72, generator=gen).to(dtype), torch.randn(rows, 72, generator=gen).to(dtype)
    exported = torch.export.export(_Linear(weight), (x,))
    options = {**aoti.package_options(dot_products=True), "aot_inductor.package": False}
    with aoti._kernels_linked(options) as linking:
        library = torch._inductor.aot_compile(exported.module(), (x,), options=linking)
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(library, 1)
    runner.update_constant_buffer({"weight": weight}, False, False, True)
    got = runner.run([x])[0]
    symbols = Path(library).read_bytes()
    assert b"aoti_torch_cpu_prebake_dot" in symbols  # linked in: nothing else is loaded to serve it
    expected = (torch.mm(x.float(), weight.float().t()) * 2).to(dtype)
    # the same float32 sum in another order, rounded once to bf16: at most one bf16 step apart (fp32:
    # a few float32 steps)
    exact = {"atol": 0, "rtol": 2**-7} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(got, expected, **exact)
