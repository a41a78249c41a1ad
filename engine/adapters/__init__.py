"""Engine adapters: each engine's compiled artifacts, and how it starts from them.

    base.py         the EngineAdapter interface (and EngineStartError)
    bundled.py      prebake's own engine: autotune tactics and an Inductor cache as graphs
    vllm_engine.py  vLLM, and vLLM on Gaudi: vLLM's compile cache (+ HPU recipes) as graphs
    vllm.py         vLLM process tooling: flags, variables, start, readiness, log reading
    gaudi.py        vllm-gaudi's bucket variables and the HPU recipe cache

`adapter_for` is the one place that maps a recipe's engine (and a target's platform) to an
adapter; `kinds_for` gives a target's whole kind table: the shared buckets kind, then what
the adapter compiles. Nothing here writes os.environ: environments go to child processes.
"""

from __future__ import annotations

from artifacts.errors import RecipeError
from artifacts.kinds import BUCKETS, KindTable
from artifacts.recipes import Recipe, Target
from engine.adapters.base import EngineAdapter, EngineStartError
from engine.adapters.bundled import BundledAdapter
from engine.adapters.vllm_engine import VllmAdapter, VllmGaudiAdapter

ADAPTERS: tuple[EngineAdapter, ...] = (BundledAdapter(), VllmGaudiAdapter(), VllmAdapter())  # most specific first


# Every artifact kind some engine bakes, in build order (what `ls --kind` / `store rm --kind` accept).
KIND_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys([BUCKETS.name, *(k.name for adapter in ADAPTERS for k in adapter.kinds())])
)


def adapter_for(recipe: Recipe, target: Target) -> EngineAdapter:
    for adapter in ADAPTERS:
        if adapter.handles(recipe, target):
            return adapter
    engines = sorted({a.name for a in ADAPTERS})
    raise RecipeError(f"recipe {recipe.model.name} names engine {recipe.model.engine!r}; prebake serves {engines}")


def kinds_for(recipe: Recipe, target: Target) -> KindTable:
    """The target's kinds in build order: buckets, then the kinds its engine compiles."""
    return KindTable([BUCKETS, *adapter_for(recipe, target).kinds()])


__all__ = ["ADAPTERS", "KIND_NAMES", "EngineAdapter", "EngineStartError", "adapter_for", "kinds_for"]
