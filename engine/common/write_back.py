"""Write-back: what an engine compiled in place on a miss, packed and published for the next start.

One policy for every engine: the kinds built in place, in build order (upstream first), each on
the upstream bundles the engine ran with (installed at start, or written back just before it, so
`prebake promote` can promote the set upstream first; a kind whose upstream failed is not written
back); one time box for the whole write-back; one WrittenBack per kind, reported as it happens,
a failure logged and never fatal. It goes to the registry's quarantine namespace unless
PREBAKE_WRITE_BACK=index or the registry is the embedded one (prebake.registry.review.writeback);
the trust policy does not judge quarantine, `prebake promote` does. Each engine gives only how a
kind's tree is captured (`builds`); the bake itself is prebake.artifacts.bake.bake_kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from prebake.artifacts.bake.bake_kind import Baked, bake_kind
from prebake.artifacts.errors import BuildError
from prebake.artifacts.fetch import pipeline
from prebake.artifacts.recipe.kinds import Builder, TargetKeys
from prebake.artifacts.store.local import Installed
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
    installed: Mapping[str, Installed],
    timeout: float,
    report: Callable[[WrittenBack], None] = lambda result: None,
) -> list[WrittenBack]:
    """Publish every kind of `builds`, upstream first, within `timeout` seconds in all, each on the
    upstream bundles of `installed` (what the engine started with) or written back before it."""
    deadline = time.monotonic() + timeout
    results: list[WrittenBack] = []
    made = dict(installed)
    publishing = services.publishing
    for kind in (k for k in plan.kinds.names if k in builds):

        def publish(kind: str = kind) -> Baked:
            if missing := [k for k in plan.kinds[kind].upstream if k in builds and k not in made]:
                raise BuildError(f"it is built on {', '.join(missing)}, whose write-back failed (above)")
            return bake_kind(
                publishing.plan(plan),
                kind,
                store=services.store,
                registry=publishing.open_registry(),
                sign=publishing.sign,
                trust=publishing.trust,
                build=builds[kind],
                attest=publishing.attest,
                inputs=dict(made),
            )

        outcome = within(max(0.0, deadline - time.monotonic()), publish, name="prebake-write-back")
        if isinstance(outcome, Done):
            made[kind] = outcome.value.installed
            note = f"{outcome.value.note} to {publishing.target.describe()}"
            result = WrittenBack(kind, plan.key(kind).digest, True, note)
        elif isinstance(outcome, Raised):
            result = WrittenBack(kind, plan.key(kind).digest, False, f"failed: {outcome.describe()}")
        else:
            result = WrittenBack(kind, plan.key(kind).digest, False, f"failed: not finished within {timeout:g} s")
        report(result)
        results.append(result)
    return results


def answers_now(plan: TargetKeys, kinds: Sequence[str], services: Services, timeout: float) -> bool:
    """Whether the registry answers now, asked again for `kinds` within `timeout` (the start's
    registry time box): a lookup that ran out of its time box at start-up need not mean the registry
    is down (it ran beside torch's imports, long stretches under the GIL: on a loaded host a local
    folder took 16.9 s to be asked, docs/serving.md); asked again once the engine compiled, with
    nothing else running, a registry that answers gets the write-back."""
    with ExitStack() as hold:
        looked = pipeline.lookup(plan, kinds, store=services.store, source=services.source, timeout=timeout, hold=hold)
    return looked.registry is not None and looked.answered
