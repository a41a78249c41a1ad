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


class _Fake(GraphsVariant):
    """A variant of the test's own: it loads (or not) as told, without torch."""

    needs_inductor = False
    reads_in_place = True
    taking = "taking the fake's next"

    def __init__(self, name: str, outcome, after: str | None = None, refusal: str | None = None):
        self.name, self.outcome, self.after, self.refusal, self.loads = name, outcome, after, refusal, []

    def refuses(self, target):
        return self.refusal

    def compile(self, job):
        raise AssertionError("the warm-up compiles nothing")

    def load(self, job):
        self.loads.append(job.tree)
        return self.outcome

    def next_in(self, tree):
        return self.after


def _warm(tmp_path, **variants):
    from prebake.artifacts.recipe.schema import Target
    from prebake.engine.bundled.runtime.metrics import Metrics
    from prebake.engine.bundled.start import StartupPhaseLog
    from prebake.engine.bundled.warm_up import GraphsTree, WarmUp

    lines: list[str] = []
    log = StartupPhaseLog(Metrics(), lines.append)
    tree = GraphsTree(None, tmp_path, path=tmp_path, private=True)
    return WarmUp(log, tree, target=Target("tiny-llama", "cpu", 2, "fp32")), lines


def _job(tree):
    from prebake.engine.bundled.variants.base import LoadJob

    return LoadJob(None, None, "default", (), tree, print)  # type: ignore[arg-type]  # the fakes read only the tree


def test_the_warm_up_walks_the_chain_logging_and_counting_each_variant_that_does_not_load(tmp_path, monkeypatch):
    from prebake.engine.bundled.variants.base import Loaded, NotLoaded

    served = Loaded(steps="the second's steps", parts={"bind": 0.5})  # type: ignore[arg-type]
    first, second = _Fake("fake-first", NotLoaded("its bytes are damaged"), "fake-second"), _Fake("fake-second", served)
    monkeypatch.setitem(VARIANTS, first.name, first)
    monkeypatch.setitem(VARIANTS, second.name, second)
    warm, lines = _warm(tmp_path)
    assert warm.graphs("fake-first", _job) is served
    assert lines == ["prebake serve:   fake-first: its bytes are damaged; taking the fake's next"]
    assert warm.log.metrics.get("prebake_variant_fallbacks_total", variant="fake-first") == 1
    assert first.loads == second.loads == [tmp_path] and warm.parts == {"bind": 0.5}


def test_a_variant_that_refuses_the_target_is_not_loaded_and_the_chain_ends_in_a_compile(tmp_path, monkeypatch):
    from prebake.engine.bundled.variants.base import Loaded

    refusing = _Fake("fake-tp1", Loaded(steps=None), refusal="its graphs are one process's: tp 2 asks for two")  # type: ignore[arg-type]
    monkeypatch.setitem(VARIANTS, refusing.name, refusing)
    warm, lines = _warm(tmp_path)
    assert warm.graphs("fake-tp1", _job) is None  # the start compiles in place
    assert refusing.loads == [] and "fake-tp1: its graphs are one process's: tp 2 asks for two;" in lines[0]
