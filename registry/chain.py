"""A chain of registries, nearest first: for example the local folder, then S3, then the Hub.

A lookup asks each registry in order and the first hit wins. A hit in a farther registry is
copied into the nearer writable ones (backfill, as ccache and sccache do with their
levels) when its blob is fetched: fetch_blob downloads once, from the registry that
answered, and then publishes the manifest and that file into each nearer registry, so the
next lookup is answered close by. Backfilling at fetch rather than at lookup keeps lookups
cheap (the engine time-boxes them) and downloads each blob once. A backfill failure is
logged and never fails the fetch.

Publishing goes to the first registry only: put the registry you bake into first.

A registry that is down is skipped with a warning. If a farther one answers, that answer
stands; if none does, lookup raises RegistryUnavailable instead of reporting a miss, so the
caller can tell "nobody has it" from "someone could not be asked".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.registry.base import Listed, Published, Registry, listed
from prebake.registry.errors import RegistryError, RegistryUnavailable

log = logging.getLogger(__name__)

_REMEMBERED_HITS = 4096  # far hits waiting for their fetch; the oldest are forgotten first


class ChainRegistry:
    """Several registries behaving as one, nearest first."""

    def __init__(self, registries: Sequence[Registry]):
        if not registries:
            raise RegistryError("a registry chain needs at least one registry")
        self.registries = tuple(registries)
        self.url = ",".join(r.url for r in self.registries)
        self._far_hits: dict[str, list[tuple[int, Manifest]]] = {}  # blob digest -> (source index, manifest)
        self._lock = threading.Lock()

    @property
    def writable(self) -> bool:
        return self.registries[0].writable

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        down: list[RegistryUnavailable] = []
        for i, registry in enumerate(self.registries):
            try:
                manifest = registry.lookup(kind, key_digest)
            except RegistryUnavailable as exc:
                log.warning("registry %s skipped: %s", registry.url, exc)
                down.append(exc)
                continue
            if manifest is not None:
                if i > 0:
                    self._remember(i, manifest)
                return manifest
        if down:
            raise RegistryUnavailable(
                f"no reachable registry of {self.url} has {kind}/{key_digest[:16]}, and {len(down)} could not be "
                f"asked: {'; '.join(str(e) for e in down)}"
            ) from down[0]
        return None

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        with self._lock:
            hits = self._far_hits.pop(digest, [])
        sources = sorted({i for i, _ in hits})
        order = sources + [i for i in range(len(self.registries)) if i not in sources]
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
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"also tried: {other}")
        raise first

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        return self.registries[0].publish(manifest, blob)

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        seen: set[tuple[str, str]] = set()
        for registry in self.registries:
            for manifest in registry.list(kind):
                if (manifest.kind, manifest.key_digest) not in seen:
                    seen.add((manifest.kind, manifest.key_digest))
                    yield manifest

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """list()'s rows, each member listed through its summary where it keeps one."""
        seen: set[tuple[str, str]] = set()
        for registry in self.registries:
            for row in listed(registry, kind):
                if (row.kind, row.key_digest) not in seen:
                    seen.add((row.kind, row.key_digest))
                    yield row

    def __repr__(self) -> str:
        return f"ChainRegistry({list(self.registries)!r})"

    def _remember(self, source: int, manifest: Manifest) -> None:
        with self._lock:
            self._far_hits.setdefault(manifest.blob.digest, []).append((source, manifest))
            while len(self._far_hits) > _REMEMBERED_HITS:
                del self._far_hits[next(iter(self._far_hits))]

    def _backfill(self, source: int, manifest: Manifest, blob: Path) -> None:
        for registry in self.registries[:source]:
            if not registry.writable:
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
