"""Decode's one-row products and one-query attention as Inductor reductions (runtime.gemv): which products
and attention calls the pass takes, that the attention it writes answers as torch's kernel, that every
graphs variant's compile carries it except an FP8 model's, and that its version is in the graphs key.
That the package's decode calls no mm and no SDPA and answers as eager: tests/integration/test_aoti_package.py."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from prebake.artifacts.recipe.kinds import target_keys
from prebake.artifacts.recipe.schema import load_recipe, targets
from prebake.engine.adapters import kinds_for
from prebake.engine.bundled.runtime import aoti, gemv, steps
from prebake.engine.common.probe import probe


def _node(graph: torch.fx.Graph, name: str, value: torch.Tensor) -> torch.fx.Node:
    node = graph.placeholder(name)
    node.meta["val"] = value
    return node


@pytest.mark.parametrize(
    ("rows", "dtype", "device", "taken"),
    [
        (1, torch.float32, "cpu", True),
        (1, torch.bfloat16, "cpu", True),
        (gemv.MAX_ROWS + 1, torch.float32, "cpu", False),  # batched decode and prefill: torch's mm
        (1, torch.int64, "cpu", False),
        (1, torch.float32, "meta", False),  # another device's products are its own
    ],
)
def test_the_pass_takes_cpu_float_products_of_at_most_max_rows(rows, dtype, device, taken):
    graph = torch.fx.Graph()
    a = _node(graph, "a", torch.empty(rows, 8, dtype=dtype, device=device))
    b = _node(graph, "b", torch.empty(8, 4, dtype=dtype, device=device))
    assert gemv.rewrites(a, b) is taken


def _flash(q, k, v, mask):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)[0]


def _passed(q, k, v, mask) -> torch.fx.GraphModule:
    """One SDPA call as the pass sees it in Inductor's post-grad graph (fake values, the unread logsumexp
    gone), after the pass."""
    module = make_fx(_flash, tracing_mode="fake")(q, k, v, mask)
    module.graph.eliminate_dead_code()
    with _fake_mode(module):
        gemv.decode_matmuls()(module.graph)
    module.recompile()
    return module


def _fake_mode(module: torch.fx.GraphModule):
    """Inductor's fake mode set to the one `module` was traced in, as the pass runs inside Inductor."""
    from torch._guards import detect_fake_mode
    from torch._inductor.virtualized import V

    return V.set_fake_mode(detect_fake_mode([n.meta["val"] for n in module.graph.nodes if "val" in n.meta]))


def _calls(module: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in module.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_query_attention_becomes_reductions_that_answer_as_torchs_kernel(dtype):
    # decode's: one query row, the cache's KV heads expanded to the query heads, masked to 10 of 16 positions
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen).to(dtype) for shape in ((2, 4, 1, 8), (2, 4, 16, 8), (2, 4, 16, 8)))
    sees = (torch.arange(16) <= torch.tensor([9, 3])[:, None]).view(2, 1, 1, 16)
    mask = torch.zeros((), dtype=dtype).where(sees, float("-inf"))  # as the model's graph passes it
    module = _passed(q, k, v, mask)
    assert str(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default) not in _calls(module)
    assert "aten.sum.dim_IntList" in _calls(module)
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(module(q, k, v, mask), _flash(q, k, v, mask), **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_products_left_side_is_stored_once_a_bf16_one_widened_exactly(dtype):
    # stored in float32, a bf16 row is not widened again beside every weight (docs/performance.md); its
    # values are the bf16 row's own (Inductor would skip the rounding of x.float(): the pass widens by bits)
    x, w = torch.randn(1, 8).to(dtype), torch.randn(8, 4).to(dtype)
    module = make_fx(torch.mm, tracing_mode="fake")(x, w)
    with _fake_mode(module):
        gemv.decode_matmuls()(module.graph)
    module.recompile()
    stored = [n for n in module.graph.nodes if n.target == torch.ops.prims.inductor_force_stride_order.default]
    assert [n.meta["val"].dtype for n in stored] == [torch.float32]
    assert torch.equal(torch.fx.Interpreter(module).run(x, w), torch.sum(x.float()[:, :, None] * w[None], -2).to(dtype))


def test_prefills_attention_keeps_torchs_kernel():
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 4, 16, 8), torch.randn(1, 4, 16, 8)
    module = _passed(q, k, v, torch.zeros(1, 1, 3, 16))
    assert str(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default) in _calls(module)


def test_the_pass_is_one_instance_that_pickles_as_itself_and_keys_inductors_cache_by_its_version():
    found = gemv.decode_matmuls()
    assert pickle.loads(pickle.dumps(found)) is found  # the compile workers get the same pass
    assert gemv.KEY in found.uuid()


def test_every_package_takes_the_pass_but_an_fp8_models():
    assert aoti.package_options()["post_grad_custom_post_pass"] is gemv.decode_matmuls()
    assert aoti.package_options(world=2)["post_grad_custom_post_pass"] is gemv.decode_matmuls()
    assert "post_grad_custom_post_pass" not in aoti.package_options(fp8=True)


def test_the_torch_compile_variants_take_the_pass_too():
    import torch._inductor.config as inductor_config

    # Inductor's own patch, not pytest's monkeypatch: the latter's undo left the option hidden ("does not
    # exist") for every later compile in the same process
    with inductor_config.patch(post_grad_custom_post_pass=None):
        steps.decode_products_as_reductions(torch.nn.Linear(2, 2))  # type: ignore[arg-type]  # no FP8 linear
        assert inductor_config.post_grad_custom_post_pass is gemv.decode_matmuls()


def test_the_graphs_key_names_the_pass_at_every_precision_but_fp8():
    recipe = load_recipe("tiny-llama")
    for target in targets(recipe):
        plan = target_keys(recipe, target, probe(), kinds_for(recipe, target))
        options = dict(dict(plan.keys["graphs"].groups)["options"])
        assert options["decode_matmuls"].startswith(gemv.KEY)  # and the kernel: tests/unit/test_dot.py
