"""A fleet plan put together: the recipe, the registry and this host (from the composition root),
and the declared builder profiles."""

from __future__ import annotations

from prebake.artifacts.bake.fleet_plan import FleetPlan, plan_fleet
from prebake.artifacts.fetch.gate import accepted_entry
from prebake.artifacts.recipe.schema import load_recipe, targets
from prebake.engine.adapters import kinds_for, refusal
from prebake.engine.compose import Context
from prebake.engine.fleet.profiles import load_profiles


def make_plan(
    model: str, *, precision: str | None, tp: int | None, registry: str | None, profiles: str | None
) -> FleetPlan:
    """The plan of `model` (narrowed to a dtype / TP size) against `registry` (default: the embedded one)."""
    recipe = load_recipe(model)
    context = Context.open(registry)
    opened = context.registry
    return plan_fleet(
        recipe,
        targets(recipe, dtype=precision, tp=tp),
        here=context.host,
        profiles=load_profiles(profiles),
        published=lambda kind, digest: (
            accepted_entry(opened, kind, digest, context.trust) is not None
        ),  # refused: work to do
        kinds_for=kinds_for,
        refuses=refusal,
        registry=opened.url,
    )
