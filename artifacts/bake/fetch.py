"""Fetching: the one pipeline every consumer runs, from keys to installed trees or explained misses.

    lookup   each kind in the store, else the registry's index       (time-boxed, one deadline)
    verify   a registry entry carries the wanted key and passes the trust policy
    install  download, check digests, unpack into the store          (time-boxed)

`prebake fetch`, the bundled engine's start-up (which logs each step on its own) and
`prebake serve|fetch --engine vllm` all run these steps. A miss is a value: it names the
key, the nearest bundle of the same kind in the registry, and every factor that differs
("software.torch: 2.13.0+cpu here, 2.14.1 there"), so an operator can tell at a glance why
a start was cold. A registry that is down, slow or corrupt is a miss, never a crash.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from prebake.artifacts.bake.kinds import TargetKeys
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError, PrebakeError, UnknownRegistryError
from prebake.artifacts.keys import Key
from prebake.artifacts.ports.registry import Registry
from prebake.artifacts.store.local import Installed, Store
from prebake.artifacts.store.stats import record_outcomes
from prebake.artifacts.timebox import Done, Raised, TimedOut, within

# Checks a manifest before anything of it is installed; returns why it is refused, or None.
TrustCheck = Callable[[Manifest], "str | None"]

MISS_SAMPLE = 32  # index entries a miss reads at most to name the nearest bundle
MISS_BUDGET_S = 2.0  # ... and the time it spends on them


@dataclass(frozen=True)
class Miss:
    """Why nothing matched: the nearest candidate and the factors that differ."""

    key: Key
    reason: str
    nearest: Key | None = None
    differing: dict[str, tuple[str, str]] = field(default_factory=dict)  # factor -> (wanted, nearest has)
    refused: bool = False  # something was there and failed a check (tampered, untrusted, corrupt, malformed)

    def explain(self) -> str:
        lines = [f"miss: {self.key.kind} {self.key.digest[:16]}: {self.reason}"]
        if self.nearest is not None:
            lines.append(f"  nearest bundle {self.nearest.digest[:16]} differs in {len(self.differing)} factor(s):")
            lines += [f"    {name}: {want} here, {have} there" for name, (want, have) in self.differing.items()]
        return "\n".join(lines)


Found = Installed | Manifest | Miss  # in the store, in the registry (not yet verified), or neither
Source = Literal["store", "registry"]


@dataclass(frozen=True)
class Lookup:
    """What the lookup step found for each kind, and the registry it asked."""

    found: dict[str, Found]
    registry: Registry | None  # None: it could not be opened within the time box
    answered: bool  # the registry answered every question within the time box


@dataclass(frozen=True)
class Resolution:
    """What was installed for one target, from where, and what missed (with its nearest bundle)."""

    plan: TargetKeys
    installed: dict[str, Installed]
    misses: tuple[Miss, ...]
    sources: dict[str, Source] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.misses

    @property
    def refused(self) -> bool:
        """Something the registry holds failed a check: `prebake fetch` exits 2, not 3."""
        return any(m.refused for m in self.misses)


# -- one key ----------------------------------------------------------------------------------


def fetch(store: Store, registry: Registry, key: Key, *, trust: TrustCheck | None = None) -> Installed | Miss:
    """The installed bundle for `key`: from the store, else from `registry` (verified), else a Miss."""
    found = _find(store, registry, key, trust)
    if isinstance(found, Manifest):
        found = verify_entry(key, found, trust)
    if isinstance(found, Manifest):
        return store.install(found, registry)
    return found


def verify_entry(key: Key, manifest: Manifest, trust: TrustCheck | None) -> Manifest | Miss:
    """The registry's entry, if it carries the wanted key and passes the trust policy."""
    if manifest.key_digest != key.digest or manifest.the_key() != key:
        return Miss(
            key, f"the registry's entry for {key.digest[:16]} carries another key; it was tampered with", refused=True
        )
    refused = None if trust is None else trust(manifest)
    return manifest if refused is None else Miss(key, f"refused by the trust policy: {refused}", refused=True)


def nearest_miss(registry: Registry, key: Key, reason: str) -> Miss:
    """A Miss naming the bundle of the same kind that shares the most factors with `key`.

    Bounded whatever the registry's size: it reads at most MISS_SAMPLE index entries of the
    kind (in listing order) and stops looking after MISS_BUDGET_S, so the start path pays the
    same for a registry of ten entries or ten thousand; the nearest is the nearest of those.
    """
    best: tuple[int, Key] | None = None
    deadline = time.monotonic() + MISS_BUDGET_S
    try:
        listing = registry.list(key.kind)
        try:
            for manifest in itertools.islice(listing, MISS_SAMPLE):
                other = manifest.the_key()
                score = len(other.diff(key))
                if best is None or score < best[0]:
                    best = (score, other)
                if time.monotonic() > deadline:
                    break
        finally:
            if isinstance(listing, Generator):  # stop a backend's read-ahead now, not when collected
                listing.close()
    except Exception as exc:  # listing is a courtesy: a failing listing must not hide the miss itself
        return Miss(key, f"{reason} (listing for the nearest bundle failed: {exc})")
    if best is None:
        return Miss(key, reason)
    return Miss(key, reason, nearest=best[1], differing=key.diff(best[1]))


def _from_store(store: Store, key: Key, trust: TrustCheck | None) -> Installed | None:
    installed = store.lookup(key.kind, key.digest)
    if installed is not None and (trust is None or trust(installed.manifest) is None):
        return installed
    return None


def _find(store: Store, registry: Registry, key: Key, trust: TrustCheck | None) -> Found:
    hit = _from_store(store, key, trust)
    if hit is not None:
        return hit
    return registry.lookup(key.kind, key.digest) or nearest_miss(
        registry, key, f"no bundle for this key in {registry.url}"
    )


# -- every kind of one target, time-boxed ------------------------------------------------------


def lookup(
    plan: TargetKeys,
    kinds: Iterable[str],
    *,
    store: Store,
    open_registry: Callable[[], Registry],
    address: str,
    trust: TrustCheck | None,
    timeout: float,
) -> Lookup:
    """Each kind: Installed (store hit), Manifest (registry entry, unverified) or Miss.

    One deadline covers opening the registry and every lookup. A registry that faults or runs
    out of time for one key is not asked again: the remaining kinds miss with the same reason.
    An address prebake does not understand is bad input and raises (UnknownRegistryError).
    """
    deadline = time.monotonic() + timeout
    wanted = list(kinds)
    opened = within(timeout, open_registry, name="prebake-open-registry")
    if isinstance(opened, Raised) and isinstance(opened.error, UnknownRegistryError):
        raise opened.error
    if not isinstance(opened, Done):
        why = _fault(opened, f"registry {address}", "--registry-timeout", timeout)
        return Lookup(
            {k: _from_store(store, plan.key(k), trust) or Miss(plan.key(k), why) for k in wanted}, None, False
        )
    registry = opened.value
    found: dict[str, Found] = {}
    fault: str | None = None
    for kind in wanted:
        key = plan.key(kind)
        if (hit := _from_store(store, key, trust)) is not None:
            found[kind] = hit
            continue
        if fault is None:
            asked = within(deadline - time.monotonic(), partial(_find, store, registry, key, None))
            if isinstance(asked, Done):
                found[kind] = asked.value
                continue
            if isinstance(asked, Raised) and isinstance(asked.error, BundleError):  # this entry, not the registry
                found[kind] = Miss(key, f"registry {address}: its entry was refused: {asked.describe()}", refused=True)
                continue
            fault = _fault(asked, f"registry {address}", "--registry-timeout", timeout)
        found[kind] = Miss(key, fault)
    return Lookup(found, registry, fault is None)


def verify(plan: TargetKeys, found: dict[str, Found], trust: TrustCheck | None) -> dict[str, Found]:
    """Every registry entry checked against its key and the trust policy; store hits pass through."""
    return {k: verify_entry(plan.key(k), v, trust) if isinstance(v, Manifest) else v for k, v in found.items()}


def install(
    found: dict[str, Found], *, store: Store, registry: Registry | None, timeout: float
) -> dict[str, Installed | Miss]:
    """Download and install every verified registry entry; one deadline for all of them."""
    deadline = time.monotonic() + timeout
    out: dict[str, Installed | Miss] = {}
    for kind, value in found.items():
        if not isinstance(value, Manifest):
            out[kind] = value
            continue
        if registry is None:  # cannot happen: entries come from an opened registry
            raise PrebakeError(f"no registry to fetch {kind} from")
        got = within(deadline - time.monotonic(), partial(store.install, value, registry), name="prebake-fetch")
        if isinstance(got, Done):
            out[kind] = got.value
        else:
            why = _fault(got, f"fetching blob {value.blob.digest[:23]}", "--fetch-timeout", timeout)
            refused = isinstance(got, Raised) and isinstance(got.error, BundleError)  # corrupt or hostile bytes
            out[kind] = Miss(value.the_key(), why, refused=refused)
    return out


def resolve(
    plan: TargetKeys,
    *,
    store: Store,
    open_registry: Callable[[], Registry],
    address: str,
    trust: TrustCheck | None,
    lookup_timeout: float = 30.0,
    fetch_timeout: float = 600.0,
    kinds: Iterable[str] | None = None,
) -> Resolution:
    """lookup -> verify -> install for every kind of `plan` (or the given kinds)."""
    looked = lookup(
        plan,
        plan.kinds.names if kinds is None else kinds,
        store=store,
        open_registry=open_registry,
        address=address,
        trust=trust,
        timeout=lookup_timeout,
    )
    checked = verify(plan, looked.found, trust)
    got = install(checked, store=store, registry=looked.registry, timeout=fetch_timeout)
    return resolution(plan, looked.found, got)


def resolution(plan: TargetKeys, found: dict[str, Found], got: dict[str, Installed | Miss]) -> Resolution:
    installed = {k: v for k, v in got.items() if isinstance(v, Installed)}
    sources: dict[str, Source] = {k: "store" if isinstance(found[k], Installed) else "registry" for k in installed}
    misses = tuple(v for v in got.values() if isinstance(v, Miss))
    return Resolution(plan, installed, misses, sources)


def _fault(outcome: Raised | TimedOut, what: str, option: str, box: float) -> str:
    """Why a time-boxed step missed; a time-out names the whole time box, not what was left of it."""
    if isinstance(outcome, TimedOut):
        return f"{what} did not answer within {box:g} s ({option}); serving without it"
    return f"{what} failed: {outcome.describe()}"


def record_resolution(store: Store, resolution: Resolution) -> None:
    """Every hit and miss of one run of the pipeline into the store's stats, in one write."""
    record_outcomes(
        store,
        hits=[(i.manifest, resolution.sources.get(k, "registry")) for k, i in resolution.installed.items()],
        misses=[(m.key.kind, m.reason, m.differing, m.key.digest) for m in resolution.misses],
    )
