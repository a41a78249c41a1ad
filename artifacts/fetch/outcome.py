"""What a fetch returns: found, installed, missed (and why), refused. Values only: this module
reads nothing and writes nothing; the pipeline (prebake.artifacts.fetch.pipeline) builds them.

A miss is a value: it names the key, the nearest bundle of the same kind in the registry and
every factor that differs ("software.torch: 2.13.0+cpu here, 2.14.1 there"), so an operator can
tell at a glance why a start was cold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.keys import Key
from prebake.artifacts.ports.registry import Registry, TrustCheck
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.store.local import Installed
from prebake.artifacts.store.stats.events import classify


@dataclass(frozen=True)
class Unreachable:
    """The registry (or every member of a chain that could have it) could not be asked: a fault or
    a time-out, not an answer. A caller maps it to its own outcome (an exit code, a metric)."""

    address: str
    timed_out: bool
    detail: str


@dataclass(frozen=True)
class Miss:
    """Why nothing matched: the nearest candidate and the factors that differ."""

    key: Key
    reason: str
    nearest: Key | None = None
    differing: dict[str, tuple[str, str]] = field(default_factory=dict)  # factor -> (wanted, nearest has)
    refused: bool = False  # something was there and failed a check (tampered, untrusted, corrupt, malformed)
    unreachable: Unreachable | None = None  # the registry could not be asked: down, refusing us, out of time
    full: bool = False  # the store's disk had no room to install it (exit 6); nothing of it was left behind

    @property
    def unavailable(self) -> bool:
        """The registry could not be asked (exit 4), as opposed to nothing matching (exit 3)."""
        return self.unreachable is not None

    def to_json(self) -> dict[str, object]:
        """The miss in a command's --json: the key, why (and its short class), the nearest bundle and how
        it differs."""
        return {
            "kind": self.key.kind,
            "key": self.key.digest,
            "reason": self.reason,
            "reason_class": classify(self.reason),
            "refused": self.refused,
            "unavailable": self.unavailable,
            "nearest": self.nearest.digest if self.nearest is not None else None,
            "differing": {name: {"wanted": want, "nearest": have} for name, (want, have) in self.differing.items()},
        }

    def explain(self) -> str:
        lines = [f"miss: {self.key.kind} {self.key.digest[:16]}: {self.reason}"]
        if self.nearest is not None:
            lines.append(f"  nearest bundle {self.nearest.digest[:16]} differs in {len(self.differing)} factor(s):")
            lines += [f"    {name}: {want} here, {have} there" for name, (want, have) in self.differing.items()]
        return "\n".join(lines)


Found = Installed | Manifest | Miss  # in the store, in the registry (not yet verified), or neither
Source = Literal["store", "registry"]


@dataclass(frozen=True)
class StoreRefused:
    """A bundle in the store that the policy in force refuses: it is not used."""

    installed: Installed
    why: str  # the policy's reason

    def explain(self) -> str:
        m = self.installed.manifest
        return (
            f"the store's {m.kind} bundle {m.key_digest[:16]} (blob {m.blob.hex[:12]}, {self.installed.tree.parent.parent}) "
            f"is refused by the trust policy in force: {self.why}; it was not used"
        )

    def fix(self) -> str:
        return (
            "publish a bundle this policy accepts (bake and sign it, or `prebake promote` it) and fetch again: "
            f"it replaces the stored one; or remove the stored one with `prebake store rm {self.installed.manifest.blob.hex[:12]}`"
        )


@dataclass(frozen=True)
class Lookup:
    """What the lookup step found for each kind, and the registry it asked."""

    found: dict[str, Found]
    registry: Registry | None  # None: it could not be opened within the time box
    answered: bool  # the registry answered every question within the time box
    store_refused: dict[str, StoreRefused] = field(default_factory=dict)  # stored bundles the policy refuses
    trust: TrustCheck | None = None  # the policy in force, its own reads bound to the lookup's deadline: verify with it


@dataclass(frozen=True)
class Resolution:
    """What was installed for one target, from where, and what missed (with its nearest bundle)."""

    plan: TargetKeys
    installed: dict[str, Installed]
    misses: tuple[Miss, ...]
    sources: dict[str, Source] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # stored bundles the policy refused and the registry replaced

    @property
    def complete(self) -> bool:
        return not self.misses

    @property
    def refused(self) -> bool:
        """Something the registry holds failed a check: `prebake fetch` exits 2, not 3."""
        return any(m.refused for m in self.misses)

    @property
    def unavailable(self) -> bool:
        """The registry could not be asked for something that missed: `prebake fetch` exits 4, not 3."""
        return any(m.unavailable for m in self.misses)


def resolution(
    plan: TargetKeys,
    found: dict[str, Found],
    got: dict[str, Installed | Miss],
    store_refused: dict[str, StoreRefused] | None = None,
) -> Resolution:
    """What was installed and what missed; a kind whose stored bundle the policy refused is a
    refused miss (naming that bundle, the reason and the fix) unless the registry replaced it."""
    refused = store_refused or {}
    installed = {k: v for k, v in got.items() if isinstance(v, Installed)}
    sources: dict[str, Source] = {k: "store" if isinstance(found[k], Installed) else "registry" for k in installed}
    misses = tuple(with_refusal(v, refused.get(k)) for k, v in got.items() if isinstance(v, Miss))
    notes = tuple(
        f"{r.explain()}; replaced by the registry's bundle (blob {installed[k].manifest.blob.hex[:12]}), which it accepts"
        for k, r in refused.items()
        if k in installed
    )
    return Resolution(plan, installed, misses, sources, notes)


def with_refusal(miss: Miss, refused: StoreRefused | None) -> Miss:
    """`miss`, refused and naming the stored bundle the policy refused (and the fix), when there was one."""
    if refused is None:
        return miss
    reason = f"{refused.explain()}, and the registry offered none it accepts ({miss.reason}). Fix: {refused.fix()}"
    return Miss(miss.key, reason, miss.nearest, miss.differing, refused=True)
