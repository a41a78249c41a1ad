"""The scenario suites (tests/faults: crashes and a hostile registry; tests/operations: the
operators, cron jobs and clients around prebake): every test is one scenario, and the session
ends with one line, counting each group:

    faults: N scenarios (faults F, operations O), N survived, P under a trust policy, bundles lost or corrupted: 0

A scenario survived when its test passed and, after it, every registry and store it
registered with the `scenario` fixture still checks out: the registry re-verified by
prebake.registry.verify (every blob re-hashed, and every signature checked against the policy
when the scenario ran under one), every bundle published to it still answered, every tree a
store's index names whole. A scenario runs under a trust policy when it says so
(`scenario.under(policy)`: tests/faults/conftest.py does it for every fault scenario, with
signed bundles and the policy file in force); P counts those. Losses and corruption are counted from those checks,
never assumed; a check that finds damage fails the scenario too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from prebake.artifacts.bundle.manifest import Manifest
from tests.faults.checks import registry_damage, store_problems

if TYPE_CHECKING:
    from prebake.artifacts.bake.fetch import TrustCheck

GROUPS = ("faults", "operations")  # the folders under tests/ whose tests are scenarios

_TALLY = pytest.StashKey["Tally"]()


@dataclass
class Tally:
    outcomes: dict[str, bool] = field(default_factory=dict)  # nodeid -> survived so far
    groups: dict[str, str] = field(default_factory=dict)  # nodeid -> its group
    skipped: int = 0
    policed: set[str] = field(default_factory=set)  # nodeids of the scenarios run under a trust policy
    lost: int = 0
    corrupted: int = 0


@dataclass
class Scenario:
    """What one scenario touched, re-checked when it ends."""

    registries: list[tuple[object, list[Manifest]]] = field(default_factory=list)
    stores: list[Path] = field(default_factory=list)
    trust: Callable[[object], TrustCheck] | None = None  # the policy in force, bound to one registry

    def under(self, trust: Callable[[object], TrustCheck]) -> None:
        """This scenario runs under a trust policy: its registries are re-verified under it too."""
        self.trust = trust

    def registry(self, registry, *published: Manifest):
        self.registries.append((registry, list(published)))
        return registry

    def store(self, home: Path) -> Path:
        self.stores.append(Path(home))
        return Path(home)


def _tally(config) -> Tally:
    return config.stash.setdefault(_TALLY, Tally())


def _group(item) -> str | None:
    parts = Path(item.path).parts
    for name in GROUPS:
        if "tests" in parts and name in parts[parts.index("tests") :]:
            return name
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    group = _group(item)
    if group is None:
        return report
    tally = _tally(item.config)
    tally.groups[report.nodeid] = group
    if report.skipped and report.when in ("setup", "call"):
        tally.skipped += 1
        tally.outcomes.pop(report.nodeid, None)
    elif report.when == "setup" and report.passed:
        tally.outcomes[report.nodeid] = True
    elif report.failed:
        tally.outcomes[report.nodeid] = False
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tally = _tally(config)
    if not tally.outcomes and not tally.skipped:
        return
    survived = sum(tally.outcomes.values())
    counts = ", ".join(f"{g} {sum(tally.groups.get(n) == g for n in tally.outcomes)}" for g in GROUPS)
    policed = len(tally.policed & tally.outcomes.keys())
    terminalreporter.write_line(
        f"faults: {len(tally.outcomes)} scenarios ({counts}), {survived} survived, "
        f"{policed} under a trust policy (signed bundles, the policy file in force), "
        f"bundles lost or corrupted: {tally.lost + tally.corrupted}"
    )
    if tally.skipped:
        terminalreporter.write_line(f"faults: {tally.skipped} scenario(s) skipped (not run, not counted)")


@pytest.fixture
def scenario(request) -> Iterator[Scenario]:
    """Register the registries and stores a scenario used; they are re-verified when it ends."""
    seen = Scenario()
    yield seen
    tally = _tally(request.config)
    if seen.trust is not None:
        tally.policed.add(request.node.nodeid)
    damage = []
    for registry, published in seen.registries:
        found = registry_damage(registry, published, None if seen.trust is None else seen.trust(registry))
        tally.lost += len(found.lost)
        tally.corrupted += len(found.corrupted)
        damage += [*found.lost, *found.corrupted]
    for home in seen.stores:
        problems = store_problems(home)
        tally.corrupted += len(problems)
        damage += problems
    assert not damage, f"bundles lost or corrupted after the scenario: {damage}"
