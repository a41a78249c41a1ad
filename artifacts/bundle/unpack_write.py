"""Writing checked members in worker threads, so that decompressing, creating files and hashing overlap.

    extraction (calling thread)         writers
    decompress, parse, check  ──small──▶ pool of threads: a run of small files each job
    against the manifest      ──large──▶ one lane: a large file's chunks in order

Only members already held to the manifest reach a writer, each writes exactly the bytes it was
given, and what waits is bounded in bytes and jobs, so unpack.py's bounds hold. A wrong digest
raises in the caller at its next hand-over or at `finish`; `close` waits for every writer and
closes every file, so the caller may remove the folder. Why threads: docs/performance.md.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from prebake.artifacts.bundle.manifest import FileEntry
from prebake.artifacts.errors import BundleError

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
BUFFER = 4 << 20  # members are handed over in buffers of this size, reused (no fresh pages to fault in)
_BUFFERS = 16  # so at most this many buffers' worth is read and not yet written
_BATCH_FILES = 64  # small files per run, at most


@dataclass(frozen=True)
class _Small:
    path: str
    folder: str
    start: int
    end: int
    entry: FileEntry


@dataclass
class _Large:
    """A large member being written by the lane: its file, its manifest entry, its running hash."""

    fd: int
    entry: FileEntry
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                if self.entry.executable:
                    os.fchmod(fd, 0o755)
            finally:
                os.close(fd)


class Folders:
    """Every folder the manifest implies, made in path order (parents first) by a thread of its own
    while members stream: on this kind of VM a mkdir costs a millisecond or more of kernel time,
    and a cache of thousands of one-kernel folders would otherwise pay it all in line."""

    def __init__(self, into: Path, folders: set[str]):
        self._order = sorted(folders)  # a parent sorts before everything under it
        self._ready = {f: threading.Event() for f in self._order}
        self.error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(
            target=self._make, args=(str(into),), name="prebake-unpack-folders", daemon=True
        )
        self._thread.start()

    def wait(self, folder: str) -> None:
        """Return once `folder` ('' for the top) exists; raise what stopped the folder thread."""
        if folder:
            self._ready[folder].wait()
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        """Wait for the last folder; raise what stopped the thread (a folder no file went into too)."""
        self._thread.join()
        self.wait("")

    def close(self) -> None:
        self._stop = True
        self._thread.join()

    def _make(self, into: str) -> None:
        try:
            for folder in self._order:
                if self._stop:
                    break
                os.mkdir(os.path.join(into, folder))
                self._ready[folder].set()
        except BaseException as exc:  # raised to whoever waits, and by the extraction at its end
            self.error = exc
        finally:
            for event in self._ready.values():  # nobody waits forever
                event.set()


class Writers:
    """Small files in runs to a pool of threads, large files chunk by chunk to one ordered lane,
    through a fixed set of reused buffers."""

    def __init__(self, workers: int, folders: Folders):
        self._folders = folders
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="prebake-unpack-write")
        self._lane = ThreadPoolExecutor(1, thread_name_prefix="prebake-unpack-large")
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._made = 0  # buffers are made as needed, up to _BUFFERS: a small tree needs one or two
        self._pending: deque[Future[None]] = deque()
        self._buf: bytearray | None = None  # the run of small files being filled
        self._used = 0
        self._batch: list[_Small] = []
        self._large: list[_Large] = []  # opened, not yet known to be closed

    def small(
        self, path: str, folder: str, size: int, room: int, entry: FileEntry, fill: Callable[[memoryview], object]
    ) -> None:
        """A small member: `fill` puts its `room` bytes (its data, then padding) into the view it is
        given; a worker writes the first `size` of them to the new file `path`. room <= BUFFER."""
        if self._buf is None or self._used + room > BUFFER or len(self._batch) >= _BATCH_FILES:
            self._flush()
            self._buf, self._used = self._take(), 0
        fill(memoryview(self._buf)[self._used : self._used + room])
        self._batch.append(_Small(path, folder, self._used, self._used + size, entry))
        self._used += room

    def open_large(self, path: str, folder: str, entry: FileEntry) -> _Large:
        self._folders.wait(folder)
        fd = os.open(path, _FLAGS, 0o644)
        job = _Large(fd, entry)
        self._large = [j for j in self._large if j.fd >= 0] + [job]
        return job

    def chunk(self, job: _Large, fill: Callable[[memoryview], int]) -> int:
        """Hand the lane the next bytes of a large member: `fill` puts up to BUFFER of them into the
        view it is given and says how many; returns that number."""
        buf = self._take()
        try:
            n = fill(memoryview(buf))
        except BaseException:
            self._free.put(buf)
            raise
        self._track(self._lane.submit(self._write_chunk, job, buf, n))
        return n

    def end_large(self, job: _Large) -> None:
        self._track(self._lane.submit(_finish_large, job))

    def finish(self) -> None:
        """Hand over what is left and wait for every writer; raise the first failure."""
        self._flush()
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        """Stop: drop what has not started, wait for what has, close every file still open."""
        for fut in self._pending:
            fut.cancel()
        self._pool.shutdown(wait=True)
        self._lane.shutdown(wait=True)
        for job in self._large:
            job.close()

    def _take(self) -> bytearray:
        while self._pending and self._pending[0].done():  # a failure shows at the next hand-over
            self._pending.popleft().result()
        if self._made < _BUFFERS and self._free.empty():
            self._made += 1
            return bytearray(BUFFER)
        return self._free.get()  # waits for a writer to give one back: bounded memory

    def _flush(self) -> None:
        if self._buf is not None and self._batch:
            self._track(self._pool.submit(self._write_batch, self._buf, tuple(self._batch)))
        elif self._buf is not None:
            self._free.put(self._buf)
        self._buf, self._batch = None, []

    def _track(self, fut: Future[None]) -> None:
        self._pending.append(fut)
        while len(self._pending) > 2 * _BUFFERS or (self._pending and self._pending[0].done()):
            self._pending.popleft().result()

    def _write_batch(self, buf: bytearray, batch: tuple[_Small, ...]) -> None:
        try:
            view = memoryview(buf)
            for item in batch:
                data = view[item.start : item.end]
                self._folders.wait(item.folder)
                fd = os.open(item.path, _FLAGS, 0o644)
                try:
                    _write_all(fd, data)
                    if item.entry.executable:
                        os.fchmod(fd, 0o755)
                finally:
                    os.close(fd)
                check_member(item.entry, hashlib.sha256(data))
        finally:
            self._free.put(buf)

    def _write_chunk(self, job: _Large, buf: bytearray, n: int) -> None:
        try:
            data = memoryview(buf)[:n]
            if job.fd >= 0:
                _write_all(job.fd, data)
            job.hasher.update(data)
        finally:
            self._free.put(buf)


def _finish_large(job: _Large) -> None:
    job.close()
    check_member(job.entry, job.hasher)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


def check_member(entry: FileEntry, hasher: hashlib._Hash, what: str = "") -> None:
    """A member's bytes (hashed into `hasher`) against its manifest entry; `what`: the bundle, named first."""
    if "sha256:" + hasher.hexdigest() != entry.sha256:
        where = f"{what}: " if what else ""
        raise BundleError(f"{where}{entry.path!r} does not match its manifest's digest: the bundle is corrupt")
