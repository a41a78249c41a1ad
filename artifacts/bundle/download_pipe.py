"""A bounded pipe from a download to the extraction that consumes it.

The download calls `put` with each chunk, in order, from whatever thread it runs in; the
extraction reads the pipe as a file (`readinto`). At most a few chunks wait in between, so a
fast download waits for a slow unpacker instead of filling memory. The ends tell each other
how they stopped: `close` (the download is complete: an end marker after every chunk),
`abort` (the download failed: the extraction stops at its next read), `finished` (the
extraction ended, by the archive's end marker or a refusal: the download goes on only to
hash the rest of the blob, which decides the error to report).
"""

from __future__ import annotations

import io
import queue

IN_FLIGHT = 16  # chunks waiting in the pipe


class Aborted(Exception):
    """The download failed: the extraction stops without a verdict of its own."""


class Feed(io.RawIOBase):
    """A pipe from the download (put) to the extraction (readinto), bounded to a few chunks."""

    def __init__(self) -> None:
        self._q: queue.Queue[bytes | None] = queue.Queue(maxsize=IN_FLIGHT)
        self._buf = memoryview(b"")
        self._aborted = self._finished = False
        self.error: BaseException | None = None

    def put(self, chunk: bytes) -> None:
        """Hand a chunk on. Once the extraction ended (the archive's end marker, or a refusal) the
        rest of the blob is only downloaded and hashed, within the manifest's size: whether its
        digest matches decides between "corrupt bytes" and "a blob unlike its manifest". No bytes (a
        download's probe of its consumer's time box, artifacts/ports/registry.py) hand nothing on: an
        empty read would end the pipe."""
        if not chunk:
            return
        while not self._finished and self.error is None:
            try:
                self._q.put(bytes(chunk), timeout=0.1)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """The download is complete: the end marker goes after every chunk, however long that waits."""
        while not self._finished and self.error is None:
            try:
                self._q.put(None, timeout=0.1)
                return
            except queue.Full:
                continue

    def abort(self) -> None:
        """The download failed: wake the extraction, whatever it has not read yet is dropped."""
        self._aborted = True
        self._put_marker()

    def finished(self, error: BaseException | None) -> None:
        self.error, self._finished = error, error is None
        while not self._q.empty():  # unblock a download waiting on a full pipe
            self._q.get_nowait()

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._aborted:
            raise Aborted()
        if not self._buf:
            chunk = self._q.get()
            if self._aborted:
                raise Aborted()
            if chunk is None:
                return 0
            self._buf = memoryview(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def _put_marker(self) -> None:
        for _ in range(100):
            try:
                self._q.put(None, timeout=0.05)
                return
            except queue.Full:
                try:
                    self._q.get_nowait()
                except queue.Empty:
                    pass
