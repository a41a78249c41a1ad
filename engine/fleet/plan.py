"""The composition root of a fleet plan: recipe, registry, this host and the declared profiles."""

from __future__ import annotations

from artifacts.planning import FleetPlan, plan_fleet
from artifacts.recipes import load_recipe, targets
from artifacts.store import Store
from engine.adapters import kinds_for
from engine.compose import open_address
from engine.fleet.profiles import load_profiles
from engine.probe import current_host


def make_plan(
    model: str, *, precision: str | None, tp: int | None, registry: str | None, profiles: str | None
) -> FleetPlan:
    """The plan of `model` (narrowed to a dtype / TP size) against `registry` (default: the embedded one)."""
    recipe = load_recipe(model)
    opened = open_address(Store(), registry)
    return plan_fleet(
        recipe,
        targets(recipe, dtype=precision, tp=tp),
        here=current_host(),
        profiles=load_profiles(profiles),
        published=lambda kind, digest: opened.lookup(kind, digest) is not None,
        kinds_for=kinds_for,
        registry=opened.url,
    )
