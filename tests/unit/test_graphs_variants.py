"""The bundled engine's graphs variants behind one interface (prebake.engine.bundled.variants): the
registry, the chain a start walks on a tree, the names a recipe may ask of each engine, and what
each variant adds to the graphs key. The compiles and loads themselves: tests/integration/
test_aoti_package.py, test_precompile_fallback.py and test_serve.py."""

from __future__ import annotations

import json

import pytest

from prebake.artifacts.errors import RecipeError
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.adapters import adapter_for
from prebake.engine.bundled.variants import DEFAULT_VARIANT, VARIANTS, chain, served, variant
from prebake.engine.bundled.variants.base import GraphsVariant


def _tree(tmp_path, **document):
    (tmp_path / "graphs.json").write_text(json.dumps(document))
    return tmp_path


def test_every_variant_is_registered_once_under_its_name_the_default_first():
    assert (
        list(VARIANTS) == ["aoti-package", "dynamo-precompile", "inductor-cache"] and DEFAULT_VARIANT == "aoti-package"
    )
    assert all(isinstance(v, GraphsVariant) and v.name == name for name, v in VARIANTS.items())
    assert served() == {"aoti-package": ("dynamo-precompile",), "dynamo-precompile": (), "inductor-cache": ()}


def test_an_unknown_variant_names_the_known_ones():
    with pytest.raises(RecipeError, match="unknown graphs variant 'aotinductor'.*aoti-package, dynamo-precompile"):
        variant("aotinductor")


@pytest.mark.parametrize(
    ("document", "walked"),
    [
        ({"fallback": "none", "precompiled": False}, ["aoti-package"]),  # the default: a start compiles in place
        (
            {"fallback": "dynamo-precompile", "precompiled": True},
            ["aoti-package", "dynamo-precompile", "inductor-cache"],
        ),
        ({"fallback": "dynamo-precompile", "precompiled": False}, ["aoti-package", "inductor-cache"]),  # no precompile
        ({"precompiled": True}, ["aoti-package", "dynamo-precompile", "inductor-cache"]),  # baked before the setting
    ],
)
def test_the_chain_after_a_package_is_what_its_tree_was_baked_to_carry(tmp_path, document, walked):
    tree = _tree(tmp_path, variant="aoti-package", **document)
    assert [v.name for v in chain("aoti-package", tree)] == walked


def test_a_package_tree_without_graphs_json_has_nothing_after_it_and_the_others_end_in_the_cache(tmp_path):
    assert [v.name for v in chain("aoti-package", tmp_path)] == ["aoti-package"]
    assert [v.name for v in chain("dynamo-precompile", tmp_path)] == ["dynamo-precompile", "inductor-cache"]
    assert [v.name for v in chain("inductor-cache", tmp_path)] == ["inductor-cache"]


def test_only_a_package_loads_without_inductor_and_is_read_in_place():
    assert [(v.name, v.needs_inductor, v.reads_in_place) for v in VARIANTS.values()] == [
        ("aoti-package", False, True),
        ("dynamo-precompile", True, False),
        ("inductor-cache", True, False),
    ]


def test_a_packages_fallback_joins_its_key_and_the_other_variants_add_nothing():
    options = load_recipe("tiny-llama").compile.model_copy(update={"fallback": "dynamo-precompile"})
    assert variant("aoti-package").key_factors(options) == {"fallback": "dynamo-precompile"}
    assert variant("dynamo-precompile").key_factors(options) == {} == variant("inductor-cache").key_factors(options)


def _asking(name: str, **compile_options):
    recipe = load_recipe(name)
    return recipe.model_copy(update={"compile": recipe.compile.model_copy(update=compile_options)})


def test_a_variant_the_engine_does_not_serve_is_refused_naming_the_ones_it_does():
    with pytest.raises(RecipeError, match="engine 'prebake'.*'aotinductor' is not a graphs variant.*aoti-package"):
        adapter_for(_asking("tiny-llama", variant="aotinductor"))
    with pytest.raises(RecipeError, match="engine 'vllm'.*'aoti-package' is not.*serves inductor-cache"):
        adapter_for(_asking("tiny-llama-vllm", variant="aoti-package"))


def test_a_fallback_of_a_variant_that_carries_none_names_the_variant_that_does():
    with pytest.raises(
        RecipeError, match="fallback = 'dynamo-precompile'.*'inductor-cache'.*set variant = 'aoti-package'"
    ):
        adapter_for(_asking("tiny-llama", variant="inductor-cache", fallback="dynamo-precompile"))
    with pytest.raises(RecipeError, match="fallback = 'inductor-cache'.*; remove fallback$"):
        adapter_for(_asking("tiny-llama", fallback="inductor-cache"))
    assert adapter_for(_asking("tiny-llama", fallback="dynamo-precompile")).spec.name == "prebake"
