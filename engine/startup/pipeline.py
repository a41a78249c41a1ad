"""Resolving a recipe on this host: compute every artifact's key, then fetch or explain each miss."""

from __future__ import annotations

from dataclasses import dataclass

from artifacts.fetch import Miss, TrustCheck, fetch
from artifacts.kinds import KINDS, Plan, plans_for_host
from artifacts.recipes import Recipe
from artifacts.store import Installed, Store


@dataclass(frozen=True)
class Resolution:
    """What was installed for one target, and what missed (with its nearest bundle)."""

    plan: Plan
    installed: dict[str, Installed]
    misses: tuple[Miss, ...]

    @property
    def complete(self) -> bool:
        return not self.misses


def pick_plan(recipe: Recipe, host, *, dtype: str | None, tp: int | None) -> Plan:
    """The one target to serve: the requested dtype and TP (TP defaults to the smallest baked)."""
    plans = plans_for_host(recipe, host, dtype=dtype, tp=tp)
    return min(plans, key=lambda p: (p.target.tp, p.target.dtype))


def resolve(plan: Plan, *, store: Store, registry, trust: TrustCheck | None = None, kinds=KINDS) -> Resolution:
    """Fetch every kind of `plan` from the store or `registry`; a kind whose upstream missed misses too."""
    installed: dict[str, Installed] = {}
    misses: list[Miss] = []
    for kind in kinds:
        got = fetch(store, registry, plan.key(kind), trust=trust)
        if isinstance(got, Miss):
            misses.append(got)
        else:
            installed[kind] = got
    return Resolution(plan, installed, tuple(misses))
