"""The FP8 scheme joins the graphs key at precision fp8 only: two checkpoints of different schemes get
different graphs, a miss names the factor, and every other precision's key has no quantization group."""

from __future__ import annotations

from prebake.artifacts.recipe.kinds import target_keys
from prebake.artifacts.recipe.schema import Target, load_recipe
from prebake.engine.adapters import kinds_for
from tests.support.fp8_checkpoints import write_checkpoint
from tests.unit.test_recipe_key_digests import _PinnedHost


def _keys(weights: str, dtype: str):
    recipe = load_recipe("llama3-8b")
    recipe = recipe.model_copy(update={"model": recipe.model.model_copy(update={"weights": weights})})
    target = Target(recipe.model.name, "cpu", 1, dtype)
    return target_keys(recipe, target, _PinnedHost(), kinds_for(recipe, target)).keys


def test_the_fp8_scheme_moves_the_graphs_key_and_a_miss_names_it(tmp_path):
    write_checkpoint(tmp_path / "dynamic", "ct-channel")
    write_checkpoint(tmp_path / "static", "modelopt")
    a, b = _keys(str(tmp_path / "dynamic"), "fp8"), _keys(str(tmp_path / "static"), "fp8")
    assert a["buckets"].digest == b["buckets"].digest and a["graphs"].digest != b["graphs"].digest
    differing = a["graphs"].diff(b["graphs"])
    assert differing["quantization.format"] == ("compressed-tensors", "modelopt")
    assert differing["quantization.activations"] == ("token", "tensor")
    assert differing["quantization.weights"] == ("channel", "tensor")


def test_other_precisions_have_no_quantization_factor_even_on_an_fp8_checkpoint(tmp_path):
    write_checkpoint(tmp_path, "ct-channel")
    graphs = _keys(str(tmp_path), "bf16")["graphs"]
    assert not any(name.startswith("quantization.") for name in graphs.factors())
    assert _keys("random-checkpoint", "bf16")["graphs"].digest == _keys(str(tmp_path), "bf16")["graphs"].digest
