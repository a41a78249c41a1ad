"""The fetch pipeline: keys to installed trees or explained misses, written once (`resolve`):

    lookup   each kind in the store; the registry opened (Source.open: prebake.registry's
             open_registry), then asked for the rest; one deadline, the lookup's time box, for it all
    verify   a registry entry carries the wanted key and passes the trust policy (gate.py); a
             mounted tree is checked file by file against it and used in place (mounted.py)
    bound    the store's bound can hold every kind at once, or StoreBoundError before anything goes
    install  download, check digests, unpack into the store          (time-boxed)

It touches the store (find, use, install, stats) and the registry (lookup, download). With
`hold`, each tree is held from the moment it is found or installed, so no gc evicts early kinds
while later ones download. A registry that is down, slow or corrupt is a miss with its reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import (
    BundleError,
    MissingExtraError,
    PrebakeError,
    StoreBoundError,
    StoreError,
    StoreFullError,
)
from prebake.artifacts.fetch.explain import nearest_miss
from prebake.artifacts.fetch.gate import policy_refuses, verify_entry
from prebake.artifacts.fetch.mounted import in_place as mounted_in_place
from prebake.artifacts.fetch.outcome import (
    Found,
    Lookup,
    Miss,
    Resolution,
    StoreRefused,
    Unreachable,
    resolution,
    with_refusal,
)
from prebake.artifacts.fsutil import mib
from prebake.artifacts.keys import Key
from prebake.artifacts.ports.errors import RegistryNotFound, UnknownRegistryError, is_fault
from prebake.artifacts.ports.registry import Chained, OpenRegistry, Registry, TrustCheck
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.store.health import Damaged
from prebake.artifacts.store.local import Installed, Store
from prebake.artifacts.store.settings import MAX_BYTES_ENV
from prebake.artifacts.store.stats import record_outcomes
from prebake.artifacts.timebox import Done, Raised, TimedOut, bounded, within

log = logging.getLogger(__name__)

# How long the registry lookup may take, by command: `serve` compiles when the registry is slow, so
# it waits less; `fetch` has nothing else to do. Then the registry counts as unavailable.
REGISTRY_TIMEOUT_S = {"fetch": 30.0, "serve": 5.0}
FETCH_TIMEOUT_S = 600.0  # how long the downloads (and write-back) may take


@dataclass
class Source:
    """Where bundles come from: the registry's address, the trust policy in force for it (None: none),
    and how the registry is opened: prebake.registry.open_registry, handed in by the composition root
    (the core imports no backend). The lookup opens it in its time box; later users get the same one."""

    address: str
    trust: TrustCheck | None
    open_registry: OpenRegistry
    create: bool = False  # a folder that is not there is created (the embedded registry; a command that writes)
    home: Path | None = None  # the store's folder, where a Hub registry keeps its listing summaries
    registry: Registry | None = None  # once opened (or given: a test's double)

    def open(self) -> Registry:
        """The registry at `address`, opened by the first call and kept."""
        if self.registry is None:
            self.registry = self.open_registry(self.address, create=self.create, home=self.home)
        return self.registry


Stored = Mapping[str, "Installed | StoreRefused | None"]  # each kind's answer from the store


class Detail(Protocol):
    detail: str


class Steps(Protocol):
    """The steps of a run, each with a detail (a start times and logs them)."""

    def step(self, name: str) -> AbstractContextManager[Detail]: ...


@dataclass
class _Detail:
    detail: str = ""


class Quiet:
    """Steps that say nothing: a fetch that is not a start."""

    @contextmanager
    def step(self, name: str) -> Iterator[_Detail]:
        yield _Detail()


# -- one key ----------------------------------------------------------------------------------


def fetch_key(
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
    return with_refusal(found, stored)


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
    source: Source,
    timeout: float,
    hold: ExitStack | None = None,
) -> Lookup:
    """Each kind: Installed (store hit, held on `hold`), Manifest (registry entry, unverified) or Miss:
    the store asked first, then the registry opened (`source.open`), then asked for the rest.

    One deadline covers opening the registry and every lookup, and the trust policy's own reads
    (its revocation list, attestations): `Lookup.trust` is the policy bound to that deadline, for
    the verify step, so no read of it extends the box. A registry that cannot be opened in time
    misses every kind the store lacks. An address prebake does not understand, or cannot open
    without an extra, is bad input and raises.
    """
    deadline = time.monotonic() + timeout
    trust = bounded(source.trust, deadline)
    wanted = list(kinds)
    stored = {k: _from_store(store, plan.key(k), trust, hold) for k in wanted}
    refused = {k: v for k, v in stored.items() if isinstance(v, StoreRefused)}
    opened = within(timeout, source.open, name="prebake-open-registry")  # the registry, opened here
    if isinstance(opened, Raised) and isinstance(opened.error, _BAD_ADDRESS):
        raise opened.error
    if not isinstance(opened, Done):
        why = _fault(opened, f"registry {source.address}", "--registry-timeout", timeout)
        down = _unreachable(opened, source.address, why)
        missed: dict[str, Found] = {
            k: v if isinstance(v := stored[k], Installed) else Miss(plan.key(k), why, unreachable=down) for k in wanted
        }
        return Lookup(missed, None, False, refused, trust)
    found = _ask_for_the_rest(opened.value, plan, stored, deadline, source.address, timeout)
    answered = not any(isinstance(v, Miss) and v.unreachable for v in found.values())
    return Lookup(found, opened.value, answered, refused, trust)


def _ask_for_the_rest(
    registry: Registry, plan: TargetKeys, stored: Stored, deadline: float, address: str, timeout: float
) -> dict[str, Found]:
    """Each kind the store lacks, asked of `registry` by `deadline`. A registry that faults or runs out
    of time for one kind is not asked again: the remaining kinds miss with the same reason."""
    found: dict[str, Found] = {}
    fault: str | None = None
    gone: Unreachable | None = None
    for kind, hit in stored.items():
        key = plan.key(kind)
        if isinstance(hit, Installed):
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
    return found


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
            full = isinstance(got, Raised) and isinstance(got.error, StoreFullError)
            down = isinstance(got, TimedOut) or (isinstance(got, Raised) and is_fault(got.error))
            gone = _unreachable(got, registry.url, why) if down and not refused and not full else None
            out[kind] = Miss(value.the_key(), why, refused=refused, unreachable=gone, full=full)
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
    source: Source,
    kinds: Iterable[str] | None = None,
    lookup_timeout: float = REGISTRY_TIMEOUT_S["fetch"],
    fetch_timeout: float = FETCH_TIMEOUT_S,
    hold: ExitStack | None = None,
    mounted: Mapping[str, Path] | None = None,
    steps: Steps | None = None,
) -> Resolution:
    """lookup -> verify -> bound -> install for every kind of `plan` (or the given kinds), each a step
    of `steps`; every tree held on `hold` (when given) from the moment it is found or installed; a
    `mounted` tree (kind -> path) is verified in place; the hits and misses go into the store's stats."""
    steps = steps or Quiet()
    wanted = plan.kinds.names if kinds is None else kinds
    looked, found = verified_entries(plan, wanted, store=store, source=source, timeout=lookup_timeout, hold=hold,
                                     mounted=mounted, steps=steps)  # fmt: skip
    with steps.step("fetch") as s:
        got = install(found, store=store, registry=looked.registry, timeout=fetch_timeout, hold=hold)
        s.detail = ", ".join(f"{k} {i.manifest.blob.hex[:12]}" for k, i in got.items() if isinstance(i, Installed))
        s.detail = s.detail or "nothing to fetch"
    answered = looked.registry is not None and looked.answered
    resolved = resolution(plan, looked.found, got, looked.store_refused, answered=answered)
    record_resolution(store, resolved)
    return resolved


def verified_entries(plan: TargetKeys, kinds: Iterable[str], *, store: Store, source: Source, timeout: float,
                     hold: ExitStack | None = None, mounted: Mapping[str, Path] | None = None,
                     steps: Steps | None = None) -> tuple[Lookup, dict[str, Found]]:  # fmt: skip
    """resolve's lookup -> verify -> bound, without its install: each kind Installed, a verified
    registry Manifest, or a Miss; for a caller that installs its own way (a snapshot streamed into
    its restore, engine/bundled/snapshot/stream.py) and records the outcome (record_resolution)."""
    steps, mounted = steps or Quiet(), mounted or {}
    with steps.step("lookup") as s:
        looked = lookup(plan, kinds, store=store, source=source, timeout=timeout, hold=hold)
        s.detail = _looked_up(looked, source.address)
    with steps.step("verify") as s:
        verified = verify(plan, looked.found, looked.trust)
        passed = sum(isinstance(v, Manifest) for v in verified.values())
        found, in_place = mounted_in_place(verified, mounted)
        s.detail = f"{passed} registry bundle(s) carry their keys and pass the trust policy{in_place}"
    check_bound(store, {k: v for k, v in found.items() if k not in mounted}, plan.target.name)
    return looked, found


def _looked_up(looked: Lookup, address: str) -> str:
    where = {Installed: "in the store", Manifest: "in the registry", Miss: "missed"}
    detail = ", ".join(f"{kind} {where[type(value)]}" for kind, value in looked.found.items())
    detail += f" (registry {address})"
    if looked.store_refused:
        detail += f"; {len(looked.store_refused)} stored bundle(s) refused by the trust policy in force"
    return detail


_BAD_ADDRESS = (UnknownRegistryError, RegistryNotFound, MissingExtraError)  # bad input, not a registry's fault


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
