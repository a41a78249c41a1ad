"""Reading ahead for the packer: reused buffers, and a thread that reads and hashes a large file.

    runs of small files ──▶ Buffers.take(size) ── filled by a reader thread ── compressed ── give()
    a large file        ──▶ ChunkReader: a thread reads 8 MiB chunks into _AHEAD_CHUNKS buffers,
                            hashing each; the caller feeds them to the compressor in order

Filling fresh memory costs a page fault per 4 KiB, which on a VM costs more than the copy;
so the buffers are taken from and given back to a pool for the length of one pack.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterator

from prebake.artifacts.errors import BundleError

_MiB = 1 << 20
_CHUNK = 8 << 20  # large files are read in pieces of this size
_AHEAD_CHUNKS = 4  # ... by a thread at most this many pieces ahead
_KEEP = 16  # buffers for runs of small files kept for reuse, at most


def unreadable(exc: OSError, path: str) -> BundleError:
    """The error for a file of the tree that cannot be read (gone, or unreadable) while it is packed."""
    return BundleError(
        f"cannot read {path} while packing it ({exc.strerror or exc}); pack a tree nobody changes while it is packed"
    )


class Buffers:
    """Reused buffers for runs of small files and chunks of large ones: filling fresh memory for
    every run costs a page fault per 4 KiB, which on a VM costs more than the copy itself."""

    def __init__(self) -> None:
        self._free: list[bytearray] = []
        self._lock = threading.Lock()
        self.chunks: queue.SimpleQueue[bytearray] | None = None

    def take(self, size: int) -> bytearray:
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf) >= size:
                    return self._free.pop(i)
        return bytearray(-(-size // _MiB) * _MiB)

    def give(self, buf: bytearray) -> None:
        with self._lock:
            if len(self._free) < _KEEP:
                self._free.append(buf)

    def chunk_pool(self) -> queue.SimpleQueue[bytearray]:
        """The few large buffers every large file is read through, one after another."""
        if self.chunks is None:
            self.chunks = queue.SimpleQueue()
            for _ in range(_AHEAD_CHUNKS):
                self.chunks.put(bytearray(_CHUNK))
        return self.chunks


class ChunkReader:
    """A thread reading one file (up to one byte past `limit`, so growth shows) into _AHEAD_CHUNKS
    reused buffers and hashing each; iterating gives each chunk's view in order, and the buffer is
    handed back when the next is asked for (the compressor has copied it by then)."""

    def __init__(self, path: str, limit: int, free: queue.SimpleQueue[bytearray]):
        self._path, self._limit, self._free = path, limit, free
        self._full: queue.SimpleQueue[tuple[bytearray, int] | BaseException | None] = queue.SimpleQueue()
        self._hash = hashlib.sha256()
        self._stop = False
        self._thread = threading.Thread(target=self._read, name="prebake-pack-read-large", daemon=True)

    def __enter__(self) -> ChunkReader:
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[memoryview]:
        while (item := self._full.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            buf, n = item
            yield memoryview(buf)[:n]
            self._free.put(buf)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def _read(self) -> None:
        try:
            left = self._limit + 1
            with open(self._path, "rb", buffering=0) as f:
                while left > 0 and not self._stop:
                    buf = self._free.get()
                    if not buf:  # the wake-up of __exit__ (or a stale one: dropped)
                        continue
                    n = f.readinto(memoryview(buf)[: min(left, _CHUNK)])
                    if not n:
                        self._free.put(buf)
                        break
                    self._hash.update(memoryview(buf)[:n])
                    left -= n
                    self._full.put((buf, n))
            self._full.put(None)
        except OSError as exc:  # handed to the caller, who raises it
            error = unreadable(exc, self._path)
            error.__cause__ = exc
            self._full.put(error)
        except BaseException as exc:
            self._full.put(exc)

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        if self._thread.is_alive():
            self._free.put(bytearray(0))  # wakes a reader waiting for a buffer; it stops at the check
        self._thread.join()
