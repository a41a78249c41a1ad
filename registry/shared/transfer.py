"""Verified transfers every backend shares: settling a publish race, copying a blob verified,
bounding a download by its manifest's size, reading entries ahead, and `prebake ls`'s rows.

A miss is `None`, never an exception; faults raise the port's errors (prebake.artifacts.ports.errors).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.ports.errors import (
    BlobDigestMismatch,
    BlobSizeMismatch,
    PublishConflict,
    RegistryError,
    RegistryUnavailable,
)
from prebake.artifacts.ports.listing import Listed
from prebake.artifacts.ports.registry import Listable, Published, Registry

T = TypeVar("T")


def missing(digest: str, where: str, registry_url: str) -> RegistryError:
    """A blob an index entry names that the registry does not have."""
    return RegistryError(
        f"blob {digest} is named by an index entry but missing at {where}; "
        f"run `prebake verify` (`--quarantine --registry {registry_url}` moves the entry aside)"
    )


def corrupt(where: str, got: str, digest: str, registry_url: str) -> BlobDigestMismatch:
    """A blob whose bytes hash to `got`, not the `digest` that names it."""
    return BlobDigestMismatch(
        f"blob {where} hashes to {got}, not {digest}: it is corrupt; "
        f"run `prebake verify --quarantine --registry {registry_url}` and rebake"
    )


def env_settings(prefix: str, fields: Mapping[str, Callable[[str], object]], env: Mapping[str, str]) -> dict[str, Any]:
    """A backend's settings from its variables: `fields` maps a field to its parser, read from
    <prefix><FIELD>; unset or empty variables are left out, so the defaults stand."""
    values: dict[str, Any] = {}
    for name, parse in fields.items():
        var = f"{prefix}{name.upper()}"
        if (raw := env.get(var, "").strip()) != "":
            try:
                values[name] = parse(raw)
            except ValueError as exc:
                raise RegistryError(f"{var}={raw!r} is not valid: {exc}; fix or unset it") from exc
    return values


def check_publishable(manifest: Manifest, blob: Path) -> None:
    """Refuse to publish a blob that is not the one `manifest` names (a stale or damaged pack)."""
    if fsutil.file_digest(blob) != manifest.blob.digest:
        raise BlobDigestMismatch(f"{blob} does not hash to {manifest.blob.digest}; repack it before publishing")


def settle(existing: Manifest, manifest: Manifest, where: str) -> Published:
    """The outcome of publishing `manifest` where `existing` already answers its key.

    The same bundle again is a no-op; a different build of the same key is refused, and the
    registry keeps the first one (a losing baker is told, and uses the published bundle).
    """
    if existing.same_bundle(manifest):
        return Published(existing, created=False, where=where)
    raise PublishConflict(
        f"{where} already names blob {existing.blob.digest[:23]}, a different build of the same key; "
        f"the registry keeps the first one (your bake is fine: use the published bundle)",
        existing_blob=existing.blob.digest,
    )


def copy_verified(
    src: Path,
    dest: Path,
    digest: str,
    *,
    where: str,
    registry_url: str,
    size: int | None = None,
    tee: Callable[[bytes], None] | None = None,
) -> Path:
    """Copy a local blob to `dest` atomically, hashing as it goes, handing each chunk to `tee`; a
    wrong digest, or more bytes than `size`, leaves no `dest`. Only a regular file is read."""
    h, sink = hashlib.sha256(), SizedSink(size, digest, where, registry_url, tee)
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RegistryError(f"cannot read blob {where}: {exc}; check the registry folder") from exc
    with os.fdopen(fd, "rb") as fin:
        st = os.fstat(fin.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BlobDigestMismatch(f"blob {where} is not a regular file; run `prebake verify --quarantine`")
        sink.announce(st.st_size)
        with fsutil.atomic_target(dest) as tmp, tmp.open("wb") as fout:
            uncaching = Uncaching(fout.fileno())
            while chunk := fin.read(1 << 20):
                sink(chunk)
                h.update(chunk)
                fout.write(chunk)
                uncaching.written(sink.seen)
            sink.finish()
            if "sha256:" + h.hexdigest() != digest:
                raise corrupt(where, "sha256:" + h.hexdigest(), digest, registry_url)
    return dest


UNCACHE_STEP = 8 << 20  # a download's written front leaves the page cache in steps of this many bytes


class Uncaching:
    """A file written once and not read again soon (a downloaded blob: engines read its unpacked tree)
    leaves the page cache as its front grows: every UNCACHE_STEP bytes, the kernel is asked to start
    writing [0, front) back and to drop what of it is clean (what it started at the step before).
    The tree unpacked beside it then reuses those pages instead of new ones: on a VM that hands freed
    memory back to its host (free page reporting, as on Firecracker), a new page costs a fault on the
    host, serialized, about 2.5 ms a MB here (docs/snapshots.md). Bytes, durability and the final
    fsync are unchanged; a file system without the advice keeps its cache."""

    def __init__(self, fd: int):
        self.fd, self.done = fd, 0

    def written(self, front: int) -> None:
        """Bytes [0, front) are written and will not be read back by this writer."""
        if front - self.done < UNCACHE_STEP:
            return
        self.done = front
        try:
            os.posix_fadvise(self.fd, 0, front, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


MIN_RATE = 1 << 20  # bytes/s: a download slower than this on average (after GRACE_S) is abandoned
GRACE_S = 300.0


class SizedSink:
    """Counts a blob's bytes as they arrive and refuses it the moment it differs from the manifest's
    size (announced up front, or as it streams), before handing the chunk on to `tee`. It also
    bounds the time: a blob that trickles in slower than MIN_RATE on average, after GRACE_S
    seconds, is abandoned (each request's own timeout catches a server that stops altogether)."""

    def __init__(
        self, size: int | None, digest: str, where: str, registry_url: str, tee: Callable[[bytes], None] | None = None
    ):
        self.size, self.digest, self.where, self.url, self.tee, self.seen = size, digest, where, registry_url, tee, 0
        self.deadline = time.monotonic() + GRACE_S + (size or 0) / MIN_RATE

    def announce(self, total: int) -> None:
        if self.size is not None and total != self.size:
            raise self._wrong(f"is {total} bytes", "it is corrupt or")

    def __call__(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.size is not None and self.seen > self.size:
            raise self._wrong(f"runs past {self.size} bytes", "it is corrupt or")
        if time.monotonic() > self.deadline:
            raise RegistryUnavailable(
                f"blob {self.where} came slower than {MIN_RATE >> 20} MiB/s on average ({self.seen} bytes so far); "
                f"abandoned it: check the network or the registry, then retry"
            )
        if self.tee is not None:
            self.tee(chunk)

    def finish(self) -> None:
        if self.size is not None and self.seen != self.size:
            raise self._wrong(f"ended after {self.seen} bytes", "it is corrupt or")

    def _wrong(self, what: str, verdict: str) -> BlobSizeMismatch:
        return BlobSizeMismatch(
            f"blob {self.where} {what}, but its manifest says {self.size}: {verdict} not blob {self.digest[:23]}; "
            f"stopped reading it; run `prebake verify --quarantine --registry {self.url}` and rebake"
        )


def listed(registry: Registry, kind: str | None = None) -> Iterator[Listed]:
    """What `prebake ls` shows: from the registry's verified summary where it keeps one
    (prebake.artifacts.ports.listing), else one row per manifest of `list()`; the same rows either way."""
    if isinstance(registry, Listable):
        yield from registry.listing(kind)
    else:
        yield from (Listed.of(m) for m in registry.list(kind))


__all__ = [
    "SizedSink",
    "Uncaching",
    "copy_verified",
    "corrupt",
    "listed",
    "missing",
    "settle",
]


def read_ahead(
    items: Iterable[T], read: Callable[[T], Manifest | None], *, readers: int, name: str
) -> Iterator[Manifest]:
    """The manifests `read` returns for `items`, in order, read `readers` at a time in parallel
    threads: the first few cost a handful of requests (a bounded miss explanation), ten thousand
    run at the server's pace (`prebake ls`). An entry deleted since it was listed (None) is left
    out; a reader that stops early waits for nothing still in flight."""
    pool = ThreadPoolExecutor(readers, thread_name_prefix=name)
    reads: deque[Future[Manifest | None]] = deque()
    try:
        for item in items:
            reads.append(pool.submit(read, item))
            while len(reads) >= readers:
                if (manifest := reads.popleft().result()) is not None:
                    yield manifest
        while reads:
            if (manifest := reads.popleft().result()) is not None:
                yield manifest
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
