"""CRIU's image streamer protocol, prebake's side (criu/img-streamer.c, `criu restore --stream`),
and the pipes it hands out: one connection on SOCKET in the images folder; per image file CRIU
sends a length-prefixed img_streamer_request_entry naming it, the reply says whether it exists,
and if it does CRIU sends a pipe's write end (SCM_RIGHTS) that gets the file's bytes. `Lane`
puts a large file into its pipe from a second thread (by reference: vmsplice.py), its last chunk held back.
stream.py serves the protocol from a bundle's verified members. Written here because nothing else
speaks it: CRIU ships only its own side, and criu-image-streamer (checkpoint-restore) is a Rust program
that reads its own stream format from stdin, packaged neither on PyPI nor in Debian.
"""

from __future__ import annotations

import fcntl
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable

from prebake.artifacts.bundle.download_pipe import Aborted
from prebake.artifacts.errors import BundleError
from prebake.engine.bundled.snapshot import vmsplice

SOCKET = "streamer-serve.sock"  # criu/img-streamer.c: the restore's socket in the images folder
CHUNK = 1 << 20  # what goes into CRIU's pipe at a time
SUN_PATH = 108  # sockaddr_un's sun_path, its terminating NUL included
LANE_BUFFERS = 8  # reused: decompressed and not yet written, at most this many chunks
_F_SETPIPE_SZ = 1031  # fcntl.h: a pipe of CHUNK bytes, so CRIU reads a chunk per wake-up
_FIELD_1_STRING, _FIELD_1_VARINT = 0x0A, 0x08  # protobuf tags of img_streamer_{request,reply}_entry's field 1


class Lane:
    """A streamed member's second thread: each chunk into CRIU's pipe (`pipe()` waits until CRIU
    asked for it), but the last, kept for the caller to write once everything matched; buffers
    handed back to be filled once the pipe no longer holds their pages. The pipe may hold them after
    `finish` (CRIU reads on): keep the lane until CRIU is done, or gone."""

    def __init__(self, pipe: Callable[[], int]):
        self.pipe, self.last = pipe, b""
        self.fd: int | None = None  # CRIU's, once it asked; None after finish: it never did
        self.buffers = [memoryview(bytearray(CHUNK)) for _ in range(LANE_BUFFERS)]  # alive while the lane is
        self.by_reference = 0  # bytes that went into the pipe by vmsplice, not copied
        self._free: queue.Queue[memoryview] = queue.Queue()
        for buffer in self.buffers:
            self._free.put(buffer)
        self._filled: queue.Queue[tuple[memoryview, int, bool] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="prebake-stream-lane", daemon=True)
        self._thread.start()

    def free(self) -> memoryview:
        return self._free.get()

    def put(self, buffer: memoryview, n: int, *, last: bool) -> None:
        self._filled.put((buffer, n, last))

    def finish(self) -> bytes:
        """The member's held last chunk, once every chunk before it was written."""
        self._filled.put(None)
        self._thread.join()
        return self.last

    def _run(self) -> None:
        broken = False  # no CRIU to write to (it failed): only drained from here, the caller ends it
        pinned: vmsplice.Pinned | None = None  # while the chunks go by reference
        while (item := self._filled.get()) is not None:
            buffer, n, last = item
            if not broken and self.fd is None:
                try:
                    self.fd = self.pipe()
                    pinned = _pinned(self.fd)
                except Aborted:
                    broken = True
            if last:
                self.last = bytes(buffer[:n])
            elif not broken and self.fd is not None:
                try:
                    if pinned is not None and vmsplice.into(self.fd, buffer[:n]):
                        self.by_reference += n
                        for free in pinned.add(buffer, n):
                            self._free.put(free)
                        continue  # in the pipe's hands until later chunks pushed it through
                    pinned = None  # refused here: written (copied) from now on
                    write(self.fd, buffer[:n])
                except OSError:
                    broken = True  # what the pipe holds stays pinned: never written to again
            self._free.put(buffer)


def _pinned(fd: int) -> vmsplice.Pinned | None:
    """CRIU's pipe widened to a chunk; how its spliced buffers are freed, None where it is wider than
    the lane can leave pinned (two buffers keep turning: the filler never waits on the pipe alone)."""
    widen(fd)
    try:
        size = vmsplice.capacity(fd)
    except OSError:
        return None
    return vmsplice.Pinned(size) if size <= (LANE_BUFFERS - 2) * CHUNK else None


# -- the protocol -----------------------------------------------------------------------------


def request(conn: socket.socket) -> str | None:
    """One request's file name, or None once CRIU closed the socket (it asks for nothing more)."""
    head = _exactly(conn, 4)
    if head is None:
        return None
    (size,) = struct.unpack("<I", head)
    body = _exactly(conn, size)
    if body is None or len(body) < 2 or body[0] != _FIELD_1_STRING:
        raise BundleError(f"CRIU's image streamer request is not one it sends ({body!r}); is CRIU >= 3.15?")
    length, at = _varint(body, 1)
    return body[at : at + length].decode()


def reply(exists: bool) -> bytes:
    body = bytes([_FIELD_1_VARINT, int(exists)])
    return struct.pack("<I", len(body)) + body


def receive_pipe(conn: socket.socket) -> int:
    _, fds, _, _ = socket.recv_fds(conn, 1, 1)
    if len(fds) != 1:
        raise BundleError("CRIU sent no pipe for an image file; is CRIU >= 3.15?")
    return fds[0]


def _exactly(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            return None
        data += got
    return data


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def write_all(fd: int, data: bytes) -> None:
    """`data` into CRIU's pipe, then closed; a CRIU that went away (EPIPE) is the restore's failure."""
    try:
        write(fd, data)
    except OSError:
        pass
    finally:
        close(fd)


def widen(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, CHUNK)
    except OSError:
        pass  # over /proc/sys/fs/pipe-max-size: the default 64 KiB works, with more wake-ups


def write(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
