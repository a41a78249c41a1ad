"""The scenario suites (tests/faults: crashes and a hostile registry; tests/operations: the
operators, cron jobs and clients around prebake): every test is one scenario, and the session
ends with one line, counting each group:

    faults: N scenarios (faults F, operations O), N survived, P under a trust policy, bundles lost or corrupted: 0;
            volumes: local disk L, tmpfs (full) T, ...

A scenario survived when its test passed and, after it, every registry and store it
registered with the `scenario` fixture still checks out: the registry re-verified by
prebake.registry.review.verify (every blob re-hashed, and every signature checked against the policy
when the scenario ran under one), every bundle published to it still answered, every tree a
store's index names whole. A scenario runs under a trust policy when it says so
(`scenario.under(policy)`: tests/faults/conftest.py does it for every fault scenario, with
signed bundles and the policy file in force); P counts those. Losses and corruption are counted from those checks,
never assumed; a check that finds damage fails the scenario too.

The tally is kept from the test reports (`pytest_runtest_logreport`), so it is whole under
pytest-xdist too: workers send every report to the controller, which counts them and prints the
line. A scenario's losses travel in its teardown report's user_properties, the one part of a
report xdist carries that a fixture can write to.
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
    from prebake.artifacts.ports.registry import TrustCheck

GROUPS = ("faults", "operations")  # the folders under tests/ whose tests are scenarios
_LOST, _CORRUPTED = "scenario_bundles_lost", "scenario_bundles_corrupted"  # user_properties names
_POLICED = "scenario_under_policy"
_VOLUME = "scenario_volume"
LOCAL_DISK = "local disk"  # the volume of a scenario that names none: the test machine's own disk


@dataclass
class Scenario:
    """What one scenario touched, re-checked when it ends."""

    registries: list[tuple[object, list[Manifest]]] = field(default_factory=list)
    stores: list[Path] = field(default_factory=list)
    trust: Callable[[object], TrustCheck] | None = None  # the policy in force, bound to one registry
    volumes: list[str] = field(default_factory=list)  # the real mounts it ran on (tests/support/mounts.py)

    def volume(self, name: str) -> None:
        """This scenario ran its store on `name` (a tmpfs, a read-only mount...): counted in the summary."""
        self.volumes.append(name)

    def under(self, trust: Callable[[object], TrustCheck]) -> None:
        """This scenario runs under a trust policy: its registries are re-verified under it too."""
        self.trust = trust

    def registry(self, registry, *published: Manifest):
        self.registries.append((registry, list(published)))
        return registry

    def store(self, home: Path) -> Path:
        self.stores.append(Path(home))
        return Path(home)


def _group(nodeid: str) -> str | None:
    parts = Path(nodeid.split("::", 1)[0]).parts
    for name in GROUPS:
        if "tests" in parts and name in parts[parts.index("tests") :]:
            return name
    return None


@dataclass(eq=False)  # a plugin: pluggy keeps plugins in sets, so it must stay hashable
class Tally:
    """One session's count, kept by the process that prints it (the controller under xdist)."""

    outcomes: dict[str, bool] = field(default_factory=dict)  # nodeid -> survived so far
    groups: dict[str, str] = field(default_factory=dict)  # nodeid -> its group
    skipped: int = 0
    policed: set[str] = field(default_factory=set)  # nodeids of the scenarios run under a trust policy
    volumes: dict[str, set[str]] = field(default_factory=dict)  # nodeid -> the volumes it named
    lost: int = 0
    corrupted: int = 0

    def pytest_runtest_logreport(self, report) -> None:
        group = _group(report.nodeid)
        if group is None:
            return
        self.groups[report.nodeid] = group
        if report.skipped and report.when in ("setup", "call"):
            self.skipped += 1
            self.outcomes.pop(report.nodeid, None)
        elif report.when == "setup" and report.passed:
            self.outcomes[report.nodeid] = True
        elif report.failed:
            self.outcomes[report.nodeid] = False
        for name, value in report.user_properties:
            if name == _LOST:
                self.lost += int(value)
            elif name == _CORRUPTED:
                self.corrupted += int(value)
            elif name == _POLICED:
                self.policed.add(report.nodeid)
            elif name == _VOLUME:
                self.volumes.setdefault(report.nodeid, set()).add(str(value))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.outcomes and not self.skipped:
            return
        survived = sum(self.outcomes.values())
        counts = ", ".join(f"{g} {sum(self.groups.get(n) == g for n in self.outcomes)}" for g in GROUPS)
        policed = len(self.policed & self.outcomes.keys())
        terminalreporter.write_line(
            f"faults: {len(self.outcomes)} scenarios ({counts}), {survived} survived, "
            f"{policed} under a trust policy (signed bundles, the policy file in force), "
            f"bundles lost or corrupted: {self.lost + self.corrupted}; volumes: {self._volumes()}"
        )
        if self.skipped:
            terminalreporter.write_line(f"faults: {self.skipped} scenario(s) skipped (not run, not counted)")

    def _volumes(self) -> str:
        counts: dict[str, int] = {}
        for nodeid in self.outcomes:
            for name in self.volumes.get(nodeid) or {LOCAL_DISK}:
                counts[name] = counts.get(name, 0) + 1
        first = [LOCAL_DISK] if LOCAL_DISK in counts else []
        return ", ".join(f"{n} {counts[n]}" for n in first + sorted(set(counts) - {LOCAL_DISK}))


def pytest_configure(config) -> None:
    """Count in the process that reports: not in a pytest-xdist worker (it has `workerinput`),
    whose reports the controller receives and counts."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Tally(), "prebake-scenario-tally")


@pytest.fixture
def scenario(request) -> Iterator[Scenario]:
    """Register the registries and stores a scenario used; they are re-verified when it ends."""
    seen = Scenario()
    yield seen
    lost, corrupted, damage = 0, 0, []
    for registry, published in seen.registries:
        found = registry_damage(registry, published, None if seen.trust is None else seen.trust(registry))
        lost += len(found.lost)
        corrupted += len(found.corrupted)
        damage += [*found.lost, *found.corrupted]
    for home in seen.stores:
        problems = store_problems(home)
        corrupted += len(problems)
        damage += problems
    request.node.user_properties += [(_LOST, lost), (_CORRUPTED, corrupted)]  # the teardown report carries them
    if seen.trust is not None:
        request.node.user_properties.append((_POLICED, 1))
    request.node.user_properties += [(_VOLUME, name) for name in seen.volumes]
    assert not damage, f"bundles lost or corrupted after the scenario: {damage}"
