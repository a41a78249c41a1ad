"""Write-back: what an engine compiled in place on a miss, packed and published for the next start.

One policy for every engine:

    order      the target's kinds in build order (upstream first), only those built in place
    time box   the whole write-back, across kinds (an engine that serves never waits longer)
    outcome    one WrittenBack per kind, published or failed with the reason, each reported as it
               happens; a failure is logged and never fatal: publishing never swallows an error,
               and it never stops an engine that is already serving

Each engine says only how a kind's tree is captured (`builds`: a builder per kind, or None for
the kind's own declared builder); the bake itself is prebake.artifacts.bake.bake_kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prebake.artifacts.bake.bake_kind import bake_kind
from prebake.artifacts.bake.kinds import Builder, TargetKeys
from prebake.artifacts.timebox import Done, Raised, within
from prebake.engine.common.adapter import Services


@dataclass(frozen=True)
class WrittenBack:
    """One kind's write-back: published (with the bake's note) or failed (with the reason)."""

    kind: str
    key: str
    published: bool
    note: str

    @property
    def outcome(self) -> str:
        return "published" if self.published else "failed"


def write_back(
    plan: TargetKeys,
    builds: Mapping[str, Builder | None],
    services: Services,
    *,
    timeout: float,
    report: Callable[[WrittenBack], None] = lambda result: None,
) -> list[WrittenBack]:
    """Publish every kind of `builds`, upstream first, within `timeout` seconds in all."""
    deadline = time.monotonic() + timeout
    results: list[WrittenBack] = []
    for kind in (k for k in plan.kinds.names if k in builds):

        def publish(kind: str = kind) -> str:
            baked = bake_kind(
                plan,
                kind,
                store=services.store,
                registry=services.registry,
                sign=services.sign,
                trust=services.trust,
                build=builds[kind],
            )
            return baked.note

        outcome = within(max(0.0, deadline - time.monotonic()), publish, name="prebake-write-back")
        if isinstance(outcome, Done):
            result = WrittenBack(kind, plan.key(kind).digest, True, outcome.value)
        elif isinstance(outcome, Raised):
            result = WrittenBack(kind, plan.key(kind).digest, False, f"failed: {outcome.describe()}")
        else:
            result = WrittenBack(kind, plan.key(kind).digest, False, f"failed: not finished within {timeout:g} s")
        report(result)
        results.append(result)
    return results
