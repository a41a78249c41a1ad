"""A chain of registries, nearest first: for example the local folder, then S3, then the Hub.

A lookup asks each member in order and the first hit wins; publishing goes to the first only.
A farther hit is backfilled into the nearer writable members when its blob is fetched, not at
lookup: lookups stay cheap (the engine time-boxes them) and each blob downloads once; a failed
backfill is logged, never fatal. A member that faults or overruns its share of the caller's time
box (`lookup_by`, the `Chained` ability) is skipped for the rest of the run, and `faults` says
why; when no member answers, lookup raises RegistryUnavailable instead of reporting a miss, so
"nobody has it" differs from "someone could not be asked". docs/registries.md ("Chains").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.ports.errors import RegistryError, RegistryUnavailable
from prebake.artifacts.ports.listing import Listed
from prebake.artifacts.ports.registry import Published, Registry, SideFiles
from prebake.artifacts.timebox import Done, Raised, within
from prebake.registry.shared.transfer import listed

log = logging.getLogger(__name__)

_REMEMBERED_HITS = 4096  # far hits waiting for their fetch; the oldest are forgotten first


@dataclass(frozen=True)
class MemberFault:
    """A chain member skipped for the rest of the run: which, and why."""

    url: str
    cause: Literal["timeout", "error"]
    detail: str

    def describe(self) -> str:
        return f"{self.url} {'did not answer in time' if self.cause == 'timeout' else 'failed'}: {self.detail}"


class ChainRegistry:
    """Several registries behaving as one, nearest first."""

    def __init__(self, registries: Sequence[Registry]):
        if not registries:
            raise RegistryError("a registry chain needs at least one registry")
        self.registries = tuple(registries)
        self.url = ",".join(r.url for r in self.registries)
        self._far_hits: dict[str, list[tuple[int, Manifest]]] = {}  # blob digest -> (source index, manifest)
        self._down: dict[int, MemberFault] = {}  # members skipped for the rest of the run
        self._lock = threading.Lock()

    @property
    def faults(self) -> tuple[MemberFault, ...]:
        """The members skipped so far, nearest first."""
        with self._lock:
            return tuple(self._down[i] for i in sorted(self._down))

    @property
    def writable(self) -> bool:
        return self.registries[0].writable

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        return self._lookup(kind, key_digest, None)

    def lookup_by(self, kind: str, key_digest: str, deadline: float) -> Manifest | None:
        """`lookup`, done by `deadline` (time.monotonic()): each member still up gets an equal share of
        what is left; one that runs past its share is skipped from then on."""
        return self._lookup(kind, key_digest, deadline)

    def _lookup(self, kind: str, key_digest: str, deadline: float | None) -> Manifest | None:
        for i, registry in enumerate(self.registries):
            if i in self._down:
                continue
            manifest = self._ask(i, partial(registry.lookup, kind, key_digest), deadline)
            if manifest is not None:
                if i > 0:
                    self._remember(i, manifest)
                return manifest
        down = self.faults
        if down:
            raise RegistryUnavailable(
                f"no reachable registry of {self.url} has {kind}/{key_digest[:16]}, and {len(down)} could not be "
                f"asked: {'; '.join(f.describe() for f in down)}"
            )
        return None

    def _ask(self, i: int, call: Callable[[], Manifest | None], deadline: float | None) -> Manifest | None:
        """One member's answer, or None with the member marked down (a fault, or past its share)."""
        if deadline is None:
            try:
                return call()
            except BundleError:  # this entry is refused, not the member: the caller reports it
                raise
            except Exception as exc:
                self._mark_down(i, "error", f"{type(exc).__name__}: {exc}")
                return None
        left = [j for j in range(i, len(self.registries)) if j not in self._down]
        share = (deadline - time.monotonic()) / max(1, len(left))
        outcome = within(share, call, name="prebake-chain-member")
        if isinstance(outcome, Done):
            return outcome.value
        if isinstance(outcome, Raised):
            if isinstance(outcome.error, BundleError):
                raise outcome.error
            self._mark_down(i, "error", outcome.describe())
        else:
            self._mark_down(i, "timeout", f"no answer within {max(share, 0):.2g} s, its share of the time box")
        return None

    def _mark_down(self, i: int, cause: Literal["timeout", "error"], detail: str) -> None:
        fault = MemberFault(self.registries[i].url, cause, detail)
        with self._lock:
            self._down.setdefault(i, fault)
        log.warning("registry %s skipped for the rest of this run: %s", fault.url, fault.detail)

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        with self._lock:
            hits = self._far_hits.pop(digest, [])
        sources = sorted({i for i, _ in hits})
        order = [
            i for i in sources + [i for i in range(len(self.registries)) if i not in sources] if i not in self._down
        ]
        errors: list[RegistryError] = []
        fed = _Fed(tee)
        for i in order:
            try:
                self.registries[i].fetch_blob(digest, dest, size=size, tee=fed if tee is not None else None)
            except RegistryError as exc:
                errors.append(exc)
                if fed.bytes:  # the consumer already has some of this copy's bytes: another copy cannot follow
                    break
                continue
            for source, manifest in hits:
                self._backfill(source, manifest, Path(dest))
            return Path(dest)
        if not errors:
            raise RegistryUnavailable(
                f"no registry of {self.url} is up to fetch {digest} from: "
                + "; ".join(f.describe() for f in self.faults)
            )
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"also tried: {other}")
        raise first

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        return self.registries[0].publish(manifest, blob)

    def put_side(self, blob_digest: str, name: str, data: bytes) -> bool:
        first = self.registries[0]
        if not isinstance(first, SideFiles):
            raise RegistryError(f"{first.url} keeps no side files; publish to a folder, S3 or Hub registry")
        return first.put_side(blob_digest, name, data)

    def put_meta(self, name: str, data: bytes) -> None:
        first = self.registries[0]
        if not isinstance(first, SideFiles):
            raise RegistryError(f"{first.url} keeps no registry files; write to a folder, S3 or Hub registry")
        first.put_meta(name, data)

    def get_meta(self, name: str) -> bytes | None:
        """The first level's copy: the level a chain publishes to is the one whose list is current."""
        for registry in self.registries:
            if isinstance(registry, SideFiles) and (data := registry.get_meta(name)) is not None:
                return data
        return None

    def get_side(self, blob_digest: str, name: str) -> bytes | None:
        """The first level's copy that has one (a side file is immutable, so any copy is the copy)."""
        for registry in self.registries:
            if isinstance(registry, SideFiles) and (data := registry.get_side(blob_digest, name)) is not None:
                return data
        return None

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        seen: set[tuple[str, str]] = set()
        for registry in self._up():
            for manifest in registry.list(kind):
                if (manifest.kind, manifest.key_digest) not in seen:
                    seen.add((manifest.kind, manifest.key_digest))
                    yield manifest

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """list()'s rows, each member listed through its summary where it keeps one."""
        seen: set[tuple[str, str]] = set()
        for registry in self._up():
            for row in listed(registry, kind):
                if (row.kind, row.key_digest) not in seen:
                    seen.add((row.kind, row.key_digest))
                    yield row

    def __repr__(self) -> str:
        return f"ChainRegistry({list(self.registries)!r})"

    def _up(self) -> tuple[Registry, ...]:
        return tuple(r for i, r in enumerate(self.registries) if i not in self._down)

    def _remember(self, source: int, manifest: Manifest) -> None:
        with self._lock:
            self._far_hits.setdefault(manifest.blob.digest, []).append((source, manifest))
            while len(self._far_hits) > _REMEMBERED_HITS:
                del self._far_hits[next(iter(self._far_hits))]

    def _backfill(self, source: int, manifest: Manifest, blob: Path) -> None:
        for i, registry in enumerate(self.registries[:source]):
            if not registry.writable or i in self._down:  # a member down for this run is not written to either
                continue
            try:
                registry.publish(manifest, blob)
                log.info(
                    "backfilled %s/%s from %s into %s",
                    manifest.kind,
                    manifest.key_digest[:16],
                    self.registries[source].url,
                    registry.url,
                )
            except Exception as exc:  # a backfill is a courtesy: it must never fail the fetch it rides on
                log.warning(
                    "could not backfill %s/%s into %s: %s", manifest.kind, manifest.key_digest[:16], registry.url, exc
                )


class _Fed:
    """A tee that counts what it passed on, so a chain knows whether it may try the next registry."""

    def __init__(self, tee: Callable[[bytes], None] | None):
        self.tee, self.bytes = tee, 0

    def __call__(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self.tee is not None:
            self.tee(chunk)
