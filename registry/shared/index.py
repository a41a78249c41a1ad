"""The registry over an object store, written once: every object-store backend is this plus a store.

    index/<kind>/<key-digest>.json    created once (create-only put), never replaced
    blobs/sha256/<aa>/<digest>.tar.zst   written before the entry that names it
    side/, meta/, summary/            the shared parts' (registry/shared/parts.py)
    quarantine/...                    what `prebake verify --quarantine` moved aside

May touch only its ObjectStores. Publishing writes the blob, then creates the entry only if absent,
so the loser of a race reads the winner's entry and settles; a Batching store writes both in one
put_many. Blobs come down in parallel ranged reads, hashed in order, refused past the manifest's size.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.errors import BundleError, PrebakeError
from prebake.artifacts.layout import (
    blob_relpath,
    index_relpath,
    parse_index_relpath,
)
from prebake.artifacts.ports.errors import (
    BlobDigestMismatch,
    RegistryError,
)
from prebake.artifacts.ports.listing import Listed, Read, summarised_listing
from prebake.artifacts.ports.objects import Batching, Movable, ObjectStore
from prebake.artifacts.ports.registry import Published
from prebake.registry.shared.parts import SharedParts, published_already, publishing, vanished
from prebake.registry.shared.ranged import OrderedSink, one_part, part_ranges, run_parts
from prebake.registry.shared.transfer import SizedSink, corrupt, missing, read_ahead, settle

log = logging.getLogger(__name__)

QUARANTINE = "quarantine"
PART_BYTES = 8 << 20  # a blob downloads in ranges of this size, `readers` at a time


class StoreRegistry(SharedParts):
    """Registry, Maintainable, Listable and SideFiles over one ObjectStore."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        readers: int = 8,
        part_bytes: int = PART_BYTES,
        summaries: ObjectStore | None = None,
    ):
        """`summaries`: where the listing summaries live, when not in `store` (the Hub keeps them on
        this machine: a write there is a commit)."""
        self.store, self.url, self.readers, self.part_bytes = store, store.url, readers, part_bytes
        self.files, self.summaries = store, store if summaries is None else summaries

    @property
    def writable(self) -> bool:
        return self.store.writable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- Registry ----------------------------------------------------------------------------

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        key = index_relpath(kind, key_digest)
        got = self.store.get(key, MAX_MANIFEST_BYTES)
        return None if got is None else Manifest.parse(got[0], self._where(key))

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        key, dest = blob_relpath(digest), Path(dest)
        where = self._where(key)
        stored = self.store.head(key)
        if stored is None:
            raise missing(digest, where, self.url)
        sized = SizedSink(size, digest, where, self.url, tee)
        sized.announce(stored.size)  # a blob larger than its manifest says is refused before a byte moves
        stop = threading.Event()
        with fsutil.atomic_target(dest) as tmp, tmp.open("w+b") as f:
            sink = OrderedSink(f, sized)

            whole = one_part(stored.size, self.part_bytes)  # one plain request, no Range

            def fetch(first: int, last: int) -> None:
                offset = first
                for chunk in self.store.read(key, first, None if whole else last):
                    if stop.is_set():
                        return
                    sink.write_at(offset, chunk)
                    offset += len(chunk)
                if offset != last + 1:
                    raise BlobDigestMismatch(
                        f"blob {where} ended after {offset} of its {stored.size} bytes: it is cut short or corrupt; "
                        f"retry, and if it persists run `prebake verify --quarantine --registry {self.url}`"
                    )

            ranges = part_ranges(stored.size, self.part_bytes)
            run_parts(ranges, fetch, workers=self.readers, name="prebake-get", stop=stop)
            sized.finish()
            if sink.digest() != digest:
                raise corrupt(where, sink.digest(), digest, self.url)
        return dest

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        blob, key = Path(blob), index_relpath(manifest.kind, manifest.key_digest)
        read_only = f"{self.url} can be read but not written here; publish to a registry you can write"
        if (settled := published_already(self, manifest, blob, self._where(key), read_only)) is not None:
            return settled
        blob_key = blob_relpath(manifest.blob.digest)
        with publishing(self.url):
            if isinstance(self.store, Batching):
                created = self.store.put_many([(blob_key, blob), (key, manifest.to_bytes())], unless=key)
            else:
                stored = self.store.head(blob_key)
                if stored is None or stored.size != manifest.blob.size:  # content-addressed: same name, same bytes
                    self.store.put(blob_key, blob)
                created = self.store.put(key, manifest.to_bytes(), create_only=True)
        if created:
            return Published(manifest, created=True, where=self._where(key))
        theirs = self.lookup(manifest.kind, manifest.key_digest)
        if theirs is None:
            raise vanished(self._where(key), "index entries", "the store's lifecycle rules")
        return settle(theirs, manifest, self._where(key))

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        """Every manifest, in key order, read `readers` at a time as they are consumed."""
        keys = (s.key for s in self.store.list(f"index/{kind}/" if kind else "index/") if parse_index_relpath(s.key))
        yield from read_ahead(keys, self._read_listed, readers=self.readers, name="prebake-list")

    # -- Listable ----------------------------------------------------------------------------

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """A row for every index entry (of one kind, if given), in list() order, from the kind's
        summary where an entry's tag still matches, else read."""
        entries = (
            (parsed[0], parsed[1], s.tag)
            for s in self.store.list(f"index/{kind}/" if kind else "index/")
            if (parsed := parse_index_relpath(s.key)) is not None
        )
        yield from summarised_listing(self, entries)

    def _read_row(self, kind: str, digest: str) -> Read:
        key = index_relpath(kind, digest)
        got = self.store.get(key, MAX_MANIFEST_BYTES)
        if got is None:  # deleted since the listing
            return Read(digest, "", None)
        return Read(digest, got[1], Listed.of(Manifest.parse(got[0], self._where(key))))

    # -- Maintainable ------------------------------------------------------------------------

    def index_entries(self) -> Iterator[tuple[str, bytes | PrebakeError]]:
        """Every object under index/ as (key, raw bytes or why it cannot be read), unparsed."""
        for stored in [s for s in self.store.list("index/") if s.key.endswith(".json")]:
            try:
                got = self.store.get(stored.key, MAX_MANIFEST_BYTES)
            except BundleError as exc:  # over the bound: report it, keep checking the rest
                yield stored.key, exc
                continue
            if got is not None:  # quarantined or removed since the listing
                yield stored.key, got[0]

    def quarantine(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> str:
        """Move an index entry (then, if given, its bad blob) under quarantine/; return the entry's new address.

        The entry goes first, so readers miss from then on; the blob follows. A move is a rename
        where the store can (Movable), else a copy, then the delete of the original, so the bytes
        are never gone."""
        moved = self._move_aside(index_relpath(kind, key_digest))
        if moved is None:
            raise RegistryError(f"cannot quarantine {kind} {key_digest[:16]}: its index entry in {self.url} is gone")
        if blob_digest is not None:
            self._move_aside(blob_relpath(blob_digest))  # None: an earlier entry naming it moved it already
        return moved

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """Delete an index entry, then (if given) its blob and every file beside it."""
        self.store.delete(index_relpath(kind, key_digest))  # first: readers miss from then on
        if blob_digest is not None:
            self.store.delete(blob_relpath(blob_digest))
            self._remove_beside(blob_digest)

    def _move_aside(self, key: str) -> str | None:
        dest = f"{QUARANTINE}/{key}"
        if self.store.head(dest) is not None:  # quarantined before: keep both for whoever investigates
            dest = f"{dest}.{time.time_ns()}"
        if isinstance(self.store, Movable):
            return self._where(dest) if self.store.move(key, dest) else None
        if self.store.head(key) is None:
            return None
        with tempfile.TemporaryDirectory(prefix="prebake-quarantine-") as scratch:
            copy = Path(scratch) / "object"
            with copy.open("wb") as f:
                for chunk in self.store.read(key):
                    f.write(chunk)
            self.store.put(dest, copy)
        self.store.delete(key)
        return self._where(dest)

    # -- helpers -----------------------------------------------------------------------------

    def _read_listed(self, key: str) -> Manifest | None:
        got = self.store.get(key, MAX_MANIFEST_BYTES)
        return None if got is None else Manifest.parse(got[0], self._where(key))  # None: deleted since listed

    def _where(self, key: str) -> str:
        return f"{self.url}/{key}"


__all__ = ["QUARANTINE", "StoreRegistry"]
