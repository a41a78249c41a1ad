"""The registry of engine adapters: each engine is one folder under engine/ and one `register` line here.

`adapter_for` is the one place that maps a recipe's engine to an adapter, and so the one check of
a recipe's engine against the registered ones (with its [engine] settings, by the adapter's
EngineSpec); `kinds_for` gives a target's whole kind table: the shared buckets kind, then what the
engine compiles. `register` also makes the host probe read the packages the engine declares, and
the CLI build the start options it declares as flags (`start_options`).
"""

from __future__ import annotations

from prebake.artifacts.errors import RecipeError
from prebake.artifacts.recipe.kinds import BUCKETS, KindTable
from prebake.artifacts.recipe.schema import Recipe, Target
from prebake.engine.bundled.adapter import BundledAdapter
from prebake.engine.common.adapter import EngineAdapter, EngineOption
from prebake.engine.common.probe import declare_packages
from prebake.engine.vllm.adapter import VllmAdapter

ADAPTERS: dict[str, EngineAdapter] = {}  # by the name a recipe's [model] engine and --engine give


def register(adapter: EngineAdapter) -> EngineAdapter:
    """Serve recipes whose engine is `adapter.spec.name` with `adapter`: a new engine's one line."""
    name = adapter.spec.name
    if name in ADAPTERS and ADAPTERS[name] is not adapter:
        raise RecipeError(f"engine {name!r} is registered twice ({ADAPTERS[name]!r}, {adapter!r})")
    declare_packages(adapter.spec.packages)
    ADAPTERS[name] = adapter
    return adapter


register(BundledAdapter())
register(VllmAdapter())


def kind_names() -> tuple[str, ...]:
    """Every artifact kind some engine bakes, in build order (what `ls --kind` / `store rm --kind` accept)."""
    return tuple(dict.fromkeys([BUCKETS.name, *(k.name for adapter in ADAPTERS.values() for k in adapter.spec.kinds)]))


def adapter_for(recipe: Recipe, target: Target | None = None) -> EngineAdapter:
    """The adapter that serves `recipe`, its [engine] settings and graphs variant checked (RecipeError naming the fix)."""
    try:
        adapter = ADAPTERS[recipe.model.engine]
    except KeyError:
        raise RecipeError(
            f"recipe {recipe.model.name} names engine {recipe.model.engine!r}; prebake serves {sorted(ADAPTERS)}: "
            f"write one of those in [model] engine, or register the engine's adapter (prebake.engine.adapters)"
        ) from None
    adapter.spec.read_settings(recipe)
    adapter.spec.graphs_variant(recipe)
    return adapter


def adapter_named(engine: str) -> EngineAdapter:
    """The adapter behind `--engine ENGINE`."""
    try:
        return ADAPTERS[engine]
    except KeyError:
        raise RecipeError(f"unknown engine {engine!r}; prebake serves {sorted(ADAPTERS)}") from None


def start_options(command: str) -> list[tuple[str, EngineOption]]:
    """Every registered engine's start options that `command` (fetch, serve) takes, with the engine
    declaring each, in registration order: the CLI builds its flags from them (a flag two engines
    declare is one flag)."""
    found: dict[str, tuple[str, EngineOption]] = {}
    for name, adapter in ADAPTERS.items():
        for option in adapter.spec.options:
            if command in option.commands:
                found.setdefault(option.flag, (name, option))
    return list(found.values())


def kinds_for(recipe: Recipe, target: Target) -> KindTable:
    """The target's kinds in build order: buckets, then the kinds its engine compiles."""
    spec = adapter_for(recipe, target).spec
    return KindTable([BUCKETS, *spec.kinds, *spec.optional_kinds(recipe, target)])


def refusal(recipe: Recipe, target: Target) -> str | None:
    """Why the target's engine cannot build or serve it (EngineSpec.refuses), or None."""
    return adapter_for(recipe, target).spec.refuses(recipe, target)


__all__ = [
    "ADAPTERS",
    "adapter_for",
    "adapter_named",
    "kind_names",
    "kinds_for",
    "refusal",
    "register",
    "start_options",
]
