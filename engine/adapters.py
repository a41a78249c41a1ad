"""The registry of engine adapters: each engine is one folder under engine/ and one line here.

    prebake.engine.common.adapter   the EngineAdapter interface (and EngineStartError, Services)
    prebake.engine.bundled          prebake's own engine: autotune tactics, Dynamo precompile or an Inductor cache
    prebake.engine.vllm             vLLM, and vLLM on Gaudi: vLLM's compile cache (+ HPU recipes) as graphs

`adapter_for` is the one place that maps a recipe's engine (and a target's platform) to an
adapter; `kinds_for` gives a target's whole kind table: the shared buckets kind, then what
the adapter compiles. Nothing here writes os.environ: environments go to child processes.
"""

from __future__ import annotations

from prebake.artifacts.bake.kinds import BUCKETS, KindTable
from prebake.artifacts.bake.recipes import Recipe, Target
from prebake.artifacts.errors import RecipeError
from prebake.engine.bundled.adapter import BundledAdapter
from prebake.engine.common.adapter import EngineAdapter, EngineStartError
from prebake.engine.vllm.adapter import VllmAdapter, VllmGaudiAdapter

ADAPTERS: tuple[EngineAdapter, ...] = (BundledAdapter(), VllmGaudiAdapter(), VllmAdapter())  # most specific first


# Every artifact kind some engine bakes, in build order (what `ls --kind` / `store rm --kind` accept).
KIND_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys([BUCKETS.name, *(k.name for adapter in ADAPTERS for k in adapter.kinds())])
)


def adapter_for(recipe: Recipe, target: Target) -> EngineAdapter:
    """The adapter that serves `recipe` on `target` (the first that handles it)."""
    for adapter in ADAPTERS:
        if adapter.handles(recipe, target):
            return adapter
    engines = sorted({a.name for a in ADAPTERS})
    raise RecipeError(f"recipe {recipe.model.name} names engine {recipe.model.engine!r}; prebake serves {engines}")


def adapter_named(engine: str) -> EngineAdapter:
    """The adapter behind `--engine ENGINE` (the first registered under that name)."""
    for adapter in ADAPTERS:
        if adapter.name == engine:
            return adapter
    raise RecipeError(f"unknown engine {engine!r}; prebake serves {sorted({a.name for a in ADAPTERS})}")


def kinds_for(recipe: Recipe, target: Target) -> KindTable:
    """The target's kinds in build order: buckets, then the kinds its engine compiles."""
    return KindTable([BUCKETS, *adapter_for(recipe, target).kinds()])


__all__ = ["ADAPTERS", "KIND_NAMES", "EngineAdapter", "EngineStartError", "adapter_for", "adapter_named", "kinds_for"]
