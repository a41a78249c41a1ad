"""The bundled engine's graphs variants: VARIANTS, one registration line each, the default first.

`variant(name)` is the one to compile or load; `chain(first, tree)` the variants a start tries
in order on `tree` (each falling to the one its tree names next); a start whose chain ends
without a load compiles in place. A new variant: its module here (a GraphsVariant) and its line.
"""

from __future__ import annotations

from pathlib import Path

from prebake.artifacts.errors import RecipeError
from prebake.artifacts.recipe.schema import NO_FALLBACK, Recipe
from prebake.engine.bundled.variants.aoti_package import AotiPackage
from prebake.engine.bundled.variants.base import GraphsVariant
from prebake.engine.bundled.variants.dynamo_precompile import DynamoPrecompile
from prebake.engine.bundled.variants.inductor_cache import InductorCache

VARIANTS: dict[str, GraphsVariant] = {}


def register(graphs_variant: GraphsVariant) -> None:
    VARIANTS[graphs_variant.name] = graphs_variant


register(AotiPackage())  # the default (docs/graphs-variants.md says why)
register(DynamoPrecompile())
register(InductorCache())

DEFAULT_VARIANT = next(iter(VARIANTS))


def variant(name: str) -> GraphsVariant:
    """The registered variant `name`; a RecipeError names the known ones."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise RecipeError(
            f"unknown graphs variant {name!r}; the bundled engine has {', '.join(VARIANTS)}: "
            f"write one of those in [compile] variant"
        ) from None


def variant_of(recipe: Recipe) -> GraphsVariant:
    """The variant `recipe` asks for, else the default (the recipe was checked with its engine:
    EngineSpec.graphs_variant)."""
    return variant(recipe.compile.variant_or(DEFAULT_VARIANT))


def fallback_of(recipe: Recipe) -> GraphsVariant | None:
    """The variant the recipe's tree also carries ([compile] fallback), or None."""
    return None if recipe.compile.fallback == NO_FALLBACK else variant(recipe.compile.fallback)


def chain(first: str, tree: Path | None) -> tuple[GraphsVariant, ...]:
    """The variants a start on `tree` tries, in order: `first`, then what each names next in it."""
    found = [variant(first)]
    while tree is not None and (name := found[-1].next_in(tree)) is not None and name not in (v.name for v in found):
        found.append(variant(name))
    return tuple(found)


def served() -> dict[str, tuple[str, ...]]:
    """What the engine's spec declares: every variant, the default first, and its trees' fallbacks."""
    return {name: v.fallbacks for name, v in VARIANTS.items()}
