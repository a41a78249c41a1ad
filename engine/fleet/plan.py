"""The composition root of a fleet plan: recipe, registry, this host and the declared profiles."""

from __future__ import annotations

from artifacts.fetch import accepted_entry
from artifacts.planning import FleetPlan, plan_fleet
from artifacts.recipes import load_recipe, targets
from artifacts.store import Store
from engine.adapters import kinds_for
from engine.fleet.profiles import load_profiles
from engine.probe import current_host
from registry import open_registry
from registry.policy import trust_in_force


def make_plan(
    model: str, *, precision: str | None, tp: int | None, registry: str | None, profiles: str | None
) -> FleetPlan:
    """The plan of `model` (narrowed to a dtype / TP size) against `registry` (default: the embedded one)."""
    recipe = load_recipe(model)
    address = Store().registry_address(registry)
    opened = open_registry(address)
    # an entry the policy in force refuses is work to do, not present
    trust = trust_in_force(warn=False, address=address, store_home=Store().home, open_registry=lambda: opened)
    return plan_fleet(
        recipe,
        targets(recipe, dtype=precision, tp=tp),
        here=current_host(),
        profiles=load_profiles(profiles),
        published=lambda kind, digest: accepted_entry(opened, kind, digest, trust) is not None,
        kinds_for=kinds_for,
        registry=opened.url,
    )
