"""Parallel ranged downloads: a blob fetched in parts at once, hashed and handed on in order.

    sink = OrderedSink(f, sized)                    # the download's file is the reorder buffer
    sink.write_at(offset, data)                     # from any thread
    run_parts(part_ranges(total, part, start=s), fetch_part, workers=8, name="...", stop=stop)

Every registry that downloads in parts uses these: the object stores' registry writes the
port's ranged reads (registry/shared/index.py), the OCI backend its ranged GETs
(registry/oci/blob.py), each from its own threads. Whatever order the parts arrive in, the bytes that became
contiguous from the front are handed on exactly once, in order, to `sized` (the manifest's size
bound, then the store's unpacker) and to the sha256: the digest is taken while downloading, a
retried part never counts twice, and memory holds one chunk per part at most.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import BinaryIO

from prebake.artifacts.ports.errors import BlobDigestMismatch
from prebake.registry.shared.transfer import SizedSink, Uncaching

_MiB = 1 << 20


class OrderedSink:
    """The download's file, written at any offset by any thread (and a retried part again, over
    itself); the front, as it becomes contiguous, goes to `sized` and the sha256 in order."""

    def __init__(self, f: BinaryIO, sized: SizedSink):
        self._fd, self._h, self._sized = f.fileno(), hashlib.sha256(), sized
        self._next = 0
        self._uncaching = Uncaching(self._fd)  # the front, hashed and handed on, is never read again
        self._ranges: dict[int, int] = {}  # written beyond the front: start -> end
        self._lock = threading.Lock()

    def write_at(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if self._sized.size is not None and end > self._sized.size:
            with self._lock:
                self._sized(bytes(end - self._next))  # refuses: the server sent more than the manifest says
        os.pwrite(self._fd, data, offset)  # outside the lock: parts land in parallel
        with self._lock:
            if offset == self._next:
                self._emit(data)  # the usual case in one stream: no slice, no copy
            elif offset < self._next < end:
                self._emit(memoryview(data)[self._next - offset :])
            elif offset > self._next:
                self._ranges[offset] = max(end, self._ranges.get(offset, 0))
            self._advance()

    def digest(self) -> str:
        return "sha256:" + self._h.hexdigest()

    def _emit(self, data: bytes | memoryview) -> None:
        self._sized(bytes(data))
        self._h.update(data)
        self._next += len(data)
        self._uncaching.written(self._next)

    def _advance(self) -> None:
        """Hand on parts written earlier out of order, now that the front has reached them."""
        while True:
            ready = [start for start, end in self._ranges.items() if start <= self._next]
            if not ready:
                return
            for start in ready:
                end = self._ranges.pop(start)
                while self._next < end:
                    chunk = os.pread(self._fd, min(end - self._next, _MiB), self._next)
                    if not chunk:
                        raise BlobDigestMismatch("the download's file lost bytes it was given; retry")
                    self._emit(chunk)


def one_part(size: int, part: int) -> bool:
    """Whether `size` bytes are one part: at most a part and a quarter (a remainder that small is
    not worth a request of its own)."""
    return size <= part + part // 4


def part_ranges(total: int, part: int, *, start: int = 0) -> Iterator[tuple[int, int]]:
    """Inclusive byte ranges of `part` bytes covering [start, total); a short remainder rides with
    the range before it (see `one_part`)."""
    first = start
    while first < total:
        last = total - 1 if one_part(total - first, part) else first + part - 1
        yield first, last
        first = last + 1


def run_parts(
    ranges: Iterable[tuple[int, int]],
    fetch: Callable[[int, int], None],
    *,
    workers: int,
    name: str,
    stop: threading.Event,
) -> None:
    """`fetch(first, last)` for every range, `workers` at a time; the first failure sets `stop` (each
    fetch checks it between chunks), cancels what has not started, and is raised once all are done."""
    with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
        futures = [pool.submit(fetch, first, last) for first, last in ranges]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception() is not None), None)
        if failed is not None:
            stop.set()
            for f in futures:
                f.cancel()
            wait(futures)
            raise failed.exception()  # type: ignore[misc]


__all__ = ["OrderedSink", "one_part", "part_ranges", "run_parts"]
