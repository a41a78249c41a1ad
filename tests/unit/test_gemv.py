"""Decode's one-row products as Inductor reductions (runtime.gemv): which products the pass takes, that
every graphs variant's compile carries it except an FP8 model's, and that its version is in the graphs
key. That the package's decode calls no mm and answers as eager: tests/integration/test_aoti_package.py."""

from __future__ import annotations

import pickle

import pytest
import torch

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


def test_the_pass_is_one_instance_that_pickles_as_itself_and_keys_inductors_cache_by_its_version():
    found = gemv.decode_matmuls()
    assert pickle.loads(pickle.dumps(found)) is found  # the compile workers get the same pass
    assert gemv.KEY in found.uuid()


def test_every_package_takes_the_pass_but_an_fp8_models():
    assert aoti.package_options()["post_grad_custom_post_pass"] is gemv.decode_matmuls()
    assert aoti.package_options(world=2)["post_grad_custom_post_pass"] is gemv.decode_matmuls()
    assert "post_grad_custom_post_pass" not in aoti.package_options(fp8=True)


def test_the_torch_compile_variants_take_the_pass_too(monkeypatch):
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "post_grad_custom_post_pass", None)
    steps.decode_products_as_reductions(torch.nn.Linear(2, 2))  # type: ignore[arg-type]  # no FP8 linear
    assert inductor_config.post_grad_custom_post_pass is gemv.decode_matmuls()


def test_the_graphs_key_names_the_pass_at_every_precision_but_fp8():
    recipe = load_recipe("tiny-llama")
    for target in targets(recipe):
        plan = target_keys(recipe, target, probe(), kinds_for(recipe, target))
        options = dict(dict(plan.keys["graphs"].groups)["options"])
        assert options["decode_matmuls"] == gemv.KEY
