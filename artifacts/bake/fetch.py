"""Fetching: the one pipeline every consumer runs, from keys to installed trees or explained misses.

    lookup   each kind in the store, else the registry's index       (time-boxed, one deadline)
    verify   a registry entry carries the wanted key and passes the trust policy
    bound    the store's bound can hold every kind at once, or StoreBoundError before anything goes
    install  download, check digests, unpack into the store          (time-boxed)

With `hold` (an ExitStack), every tree is held (`Store.use`) from the moment it is found in
the store or installed, so neither the install's own gc nor an operator's gc evicts the
early kinds while the later ones download. A store entry that fails the hit path's check
(artifacts/store/health.py) is moved aside and fetched again from the registry.

`prebake fetch`, the bundled engine's start-up (which logs each step on its own) and
`prebake serve|fetch --engine vllm` all run these steps.

The policy in force decides, whatever installed a bundle: a store hit is used only when the
trust check passes on its manifest now (a signature check, not a re-hash: the tree was
verified when it was unpacked). A stored bundle the policy refuses is a `StoreRefused`: it
is not used, the registry is asked for the key as if the store had nothing, and a bundle the
policy accepts replaces it; if the registry has none, the miss is refused (exit 2) and names
the stored bundle, the policy's reason and the fix. A miss is a value: it names the
key, the nearest bundle of the same kind in the registry, and every factor that differs
("software.torch: 2.13.0+cpu here, 2.14.1 there"), so an operator can tell at a glance why
a start was cold. A registry that is down, slow or corrupt is a miss, never a crash.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from prebake.artifacts.bake.kinds import TargetKeys
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import (
    BundleError,
    MissingExtraError,
    PrebakeError,
    RegistryNotFound,
    StoreBoundError,
    StoreError,
    UnknownRegistryError,
)
from prebake.artifacts.fsutil import mib
from prebake.artifacts.keys import Key
from prebake.artifacts.ports.errors import is_fault
from prebake.artifacts.ports.registry import Chained, Registry
from prebake.artifacts.ports.registry import TrustCheck as TrustCheck  # the port's; named here for callers
from prebake.artifacts.store.health import Damaged
from prebake.artifacts.store.local import MAX_BYTES_ENV, Installed, Store
from prebake.artifacts.store.stats import record_outcomes
from prebake.artifacts.timebox import Done, Raised, TimedOut, bounded, within

MISS_SAMPLE = 32  # index entries a miss reads at most to name the nearest bundle
MISS_BUDGET_S = 2.0  # ... and the time it spends on them

log = logging.getLogger(__name__)


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

    @property
    def unavailable(self) -> bool:
        """The registry could not be asked (exit 4), as opposed to nothing matching (exit 3)."""
        return self.unreachable is not None

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


# -- one key ----------------------------------------------------------------------------------


def fetch(
    store: Store, registry: Registry, key: Key, *, trust: TrustCheck | None = None, hold: ExitStack | None = None
) -> Installed | Miss:
    """The installed bundle for `key`: from the store (whole, and accepted by the policy in force),
    else from `registry` (verified), else a Miss."""
    stored = _from_store(store, key, trust, hold)
    if isinstance(stored, Installed):
        return stored
    found = _ask_registry(registry, key)
    if isinstance(found, Manifest):
        found = verify_entry(key, found, trust)
    if isinstance(found, Manifest):
        check_bound(store, {key.kind: found}, f"{key.kind} {key.digest[:16]}")
        return store.install(found, registry, hold=hold)
    return _with_refusal(found, stored)


def verify_entry(key: Key, manifest: Manifest, trust: TrustCheck | None) -> Manifest | Miss:
    """The registry's entry, if it carries the wanted key, is no unreviewed write-back and passes
    the trust policy."""
    if manifest.key_digest != key.digest or manifest.the_key() != key:
        return Miss(
            key, f"the registry's entry for {key.digest[:16]} carries another key; it was tampered with", refused=True
        )
    if (why := unreviewed(manifest)) is not None:
        return Miss(key, why, refused=True)
    refused = None if trust is None else trust(manifest)
    return manifest if refused is None else Miss(key, f"refused by the trust policy: {refused}", refused=True)


WRITE_BACK_LABEL = "writeback"  # on bundles a serving pod wrote back: "quarantine" until promoted


def unreviewed(manifest: Manifest) -> str | None:
    """Why an index entry is refused whatever the policy: a serving pod's write-back, which only
    the quarantine namespace may hold until `prebake promote` reviews it."""
    if manifest.labels.get(WRITE_BACK_LABEL) != "quarantine":
        return None
    return (
        f"{manifest.kind} {manifest.key_digest[:16]} is a serving pod's write-back awaiting review (label "
        f"{WRITE_BACK_LABEL}=quarantine), offered as a normal index entry: it was copied out of quarantine; "
        f"refused under every trust policy. Review it with `prebake promote`"
    )


def accepted_entry(registry: Registry, kind: str, key_digest: str, trust: TrustCheck | None) -> Manifest | None:
    """The registry's entry for this key if the policy in force accepts it: what a bake may adopt
    as already built and a plan may count as present. A refused entry is None (work to do)."""
    manifest = registry.lookup(kind, key_digest)
    if manifest is None or unreviewed(manifest) is not None or (trust is not None and trust(manifest) is not None):
        return None
    return manifest


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


def _from_store(
    store: Store, key: Key, trust: TrustCheck | None, hold: ExitStack | None = None
) -> Installed | StoreRefused | None:
    """The store's bundle for `key`, held on `hold`, if it is whole (prebake.artifacts.store.health)
    and the policy in force accepts it; a StoreRefused if the policy does not."""
    installed = _store_hit(store, key)
    if installed is None:
        return None
    if (refused := policy_refuses(installed, trust)) is not None:
        return refused
    return _held(store, installed, hold)


def policy_refuses(installed: Installed, trust: TrustCheck | None) -> StoreRefused | None:
    """Why the policy in force refuses a stored bundle, or None: a check of its manifest's
    signature and provenance rules, never a re-hash of its tree."""
    if trust is None:
        return None
    why = trust(installed.manifest)
    return None if why is None else StoreRefused(installed, why)


def _store_hit(store: Store, key: Key) -> Installed | None:
    """The store's entry, if it passes the integrity check; a damaged one is logged and healed."""
    found = store.find(key.kind, key.digest)
    if isinstance(found, Damaged):
        log.warning("%s", found.describe())
        return None
    return found


def _held(store: Store, installed: Installed, hold: ExitStack | None) -> Installed | None:
    """`installed`, held on `hold` for the caller's life; None if it was evicted before it could be."""
    if hold is None:
        return installed
    try:
        return hold.enter_context(store.use(installed))
    except StoreError:  # evicted between the lookup and the hold: a miss, fetched again
        return None


def _ask_registry(registry: Registry, key: Key, deadline: float | None = None) -> Manifest | Miss:
    """The registry's entry for `key` (never the store's), or its nearest miss; a chain shares the
    caller's deadline among its members and skips a hung one."""
    if deadline is not None and isinstance(registry, Chained):
        found = registry.lookup_by(key.kind, key.digest, deadline)
    else:
        found = registry.lookup(key.kind, key.digest)
    return found or nearest_miss(registry, key, f"no bundle for this key in {registry.url}")


def check_bound(store: Store, found: Mapping[str, Found], what: str) -> None:
    """Refuse a store bound that cannot hold these bundles at once, before anything is installed or
    evicted: past it, installing the last kind would evict the first while the caller needs both."""
    bound = store.limits.max_bytes
    if bound is None:
        return
    sizes = {
        kind: m.blob.size + m.unpacked_bytes
        for kind, value in found.items()
        if (m := value.manifest if isinstance(value, Installed) else value) is not None and isinstance(m, Manifest)
    }
    need = sum(sizes.values())
    if need > bound:
        parts = ", ".join(f"{kind} {mib(n)}" for kind, n in sizes.items())
        raise StoreBoundError(
            f"the store {store.home} is bounded to {mib(bound)} ({MAX_BYTES_ENV} or --max-size), less than "
            f"{what}'s bundles take at once ({mib(need)}: {parts}, blob and unpacked tree each); nothing was "
            f"installed or evicted: raise {MAX_BYTES_ENV} to at least {need} bytes, or unset it"
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
    hold: ExitStack | None = None,
) -> Lookup:
    """Each kind: Installed (store hit, held on `hold`), Manifest (registry entry, unverified) or Miss.

    One deadline covers opening the registry and every lookup, and the trust policy's own reads
    (its revocation list, attestations): `Lookup.trust` is the policy bound to that deadline, for
    the verify step, so no read of it extends the box. A registry that faults or runs
    out of time for one key is not asked again: the remaining kinds miss with the same reason.
    An address prebake does not understand, or cannot open without an extra, is bad input and raises.
    """
    deadline = time.monotonic() + timeout
    trust = bounded(trust, deadline)
    wanted = list(kinds)
    stored = {k: _from_store(store, plan.key(k), trust, hold) for k in wanted}
    refused = {k: v for k, v in stored.items() if isinstance(v, StoreRefused)}
    opened = within(timeout, open_registry, name="prebake-open-registry")
    if isinstance(opened, Raised) and isinstance(opened.error, _BAD_ADDRESS):
        raise opened.error
    if not isinstance(opened, Done):
        why = _fault(opened, f"registry {address}", "--registry-timeout", timeout)
        down = _unreachable(opened, address, why)
        return Lookup(
            {k: _hit_or(stored[k], Miss(plan.key(k), why, unreachable=down)) for k in wanted},
            None,
            False,
            refused,
            trust,
        )
    registry = opened.value
    found: dict[str, Found] = {}
    fault: str | None = None
    gone: Unreachable | None = None
    for kind in wanted:
        key = plan.key(kind)
        if isinstance(hit := stored[kind], Installed):
            found[kind] = hit
            continue
        if fault is None:  # nothing usable in the store: ask the registry, never the store again
            asked = within(deadline - time.monotonic(), partial(_ask_registry, registry, key, deadline))
            if isinstance(asked, Done):
                found[kind] = asked.value
                continue
            if isinstance(asked, Raised) and isinstance(asked.error, BundleError):  # this entry, not the registry
                found[kind] = Miss(key, f"registry {address}: its entry was refused: {asked.describe()}", refused=True)
                continue
            if isinstance(asked, Raised) and isinstance(asked.error, _BAD_ADDRESS):  # a bucket or repo not there
                raise asked.error
            why = _fault(asked, f"registry {address}", "--registry-timeout", timeout)
            if isinstance(asked, Raised) and isinstance(registry, Chained):  # the members that could have it are
                found[kind] = Miss(key, why, unreachable=_unreachable(asked, address, why))  # down; others may
                continue  # have the next kind, and the chain skips the down ones at no cost
            fault, gone = why, _unreachable(asked, address, why)
        found[kind] = Miss(key, fault, unreachable=gone)
    answered = fault is None and not any(isinstance(v, Miss) and v.unreachable for v in found.values())
    return Lookup(found, registry, answered, refused, trust)


def _hit_or(stored: Installed | StoreRefused | None, miss: Miss) -> Found:
    return stored if isinstance(stored, Installed) else miss


def verify(plan: TargetKeys, found: dict[str, Found], trust: TrustCheck | None) -> dict[str, Found]:
    """Every registry entry checked against its key and the trust policy; store hits pass through."""
    return {k: verify_entry(plan.key(k), v, trust) if isinstance(v, Manifest) else v for k, v in found.items()}


def install(
    found: dict[str, Found],
    *,
    store: Store,
    registry: Registry | None,
    timeout: float,
    hold: ExitStack | None = None,
) -> dict[str, Installed | Miss]:
    """Download and install every verified registry entry, each held on `hold` from the moment it
    is installed; one deadline for all of them."""
    deadline = time.monotonic() + timeout
    out: dict[str, Installed | Miss] = {}
    for kind, value in found.items():
        if not isinstance(value, Manifest):
            out[kind] = value
            continue
        if registry is None:  # cannot happen: entries come from an opened registry
            raise PrebakeError(f"no registry to fetch {kind} from")
        got = within(
            deadline - time.monotonic(),
            partial(_install_held, store, value, registry, hold, deadline),
            name="prebake-fetch",
        )
        if isinstance(got, Done):
            out[kind] = got.value
        else:
            why = _fault(got, f"fetching blob {value.blob.digest[:23]}", "--fetch-timeout", timeout)
            refused = isinstance(got, Raised) and isinstance(got.error, BundleError)  # corrupt or hostile bytes
            down = isinstance(got, TimedOut) or (isinstance(got, Raised) and _is_fault(got.error))
            gone = _unreachable(got, registry.url, why) if down and not refused else None
            out[kind] = Miss(value.the_key(), why, refused=refused, unreachable=gone)
    return out


def _install_held(
    store: Store, manifest: Manifest, registry: Registry, hold: ExitStack | None, deadline: float | None = None
) -> Installed:
    """One install, its hold taken on a private stack inside the install and handed to `hold` only
    once the install returns: an install abandoned by its time box holds nothing."""
    if hold is None:
        return store.install(manifest, registry, deadline=deadline)
    own = ExitStack()
    installed = store.install(manifest, registry, hold=own, deadline=deadline)
    hold.enter_context(own)
    return installed


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
    hold: ExitStack | None = None,
) -> Resolution:
    """lookup -> verify -> bound -> install for every kind of `plan` (or the given kinds), each tree
    held on `hold` (when given) from the moment it is found or installed."""
    looked = lookup(
        plan,
        plan.kinds.names if kinds is None else kinds,
        store=store,
        open_registry=open_registry,
        address=address,
        trust=trust,
        timeout=lookup_timeout,
        hold=hold,
    )
    checked = verify(plan, looked.found, looked.trust)
    check_bound(store, checked, plan.target.name)
    got = install(checked, store=store, registry=looked.registry, timeout=fetch_timeout, hold=hold)
    return resolution(plan, looked.found, got, looked.store_refused)


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
    misses = tuple(_with_refusal(v, refused.get(k)) for k, v in got.items() if isinstance(v, Miss))
    notes = tuple(
        f"{r.explain()}; replaced by the registry's bundle (blob {installed[k].manifest.blob.hex[:12]}), which it accepts"
        for k, r in refused.items()
        if k in installed
    )
    return Resolution(plan, installed, misses, sources, notes)


def _with_refusal(miss: Miss, refused: StoreRefused | None) -> Miss:
    if refused is None:
        return miss
    reason = f"{refused.explain()}, and the registry offered none it accepts ({miss.reason}). Fix: {refused.fix()}"
    return Miss(miss.key, reason, miss.nearest, miss.differing, refused=True)


_BAD_ADDRESS = (UnknownRegistryError, RegistryNotFound, MissingExtraError)  # bad input, not a registry's fault


def _is_fault(error: Exception) -> bool:
    """The registry could not be asked (down, refusing us, a broken connection), as opposed to a
    bundle that is missing or bad (prebake.artifacts.ports.errors.is_fault)."""
    return is_fault(error)


def _unreachable(outcome: Raised | TimedOut, address: str, why: str) -> Unreachable:
    return Unreachable(address, isinstance(outcome, TimedOut), why)


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
