"""Pages handed into a pipe by reference (vmsplice(2)), not copied: the streamed restore's pages go
into CRIU's pipe this way (stream_wire.Lane). A write(2) into a pipe copies each page into a page
the kernel allocates for the pipe, 50,000 of them for tiny-llama's 200 MB image, which on a VM that
hands freed memory back to its host (free page reporting) at times costs many times the copy
(docs/snapshots.md, "The pages into CRIU's pipe by reference"). The pipe then holds the caller's own
pages: a buffer may be written to again only once the reader took them (`Pinned`). Python has no
binding for vmsplice (os.splice is splice(2), file to pipe), hence ctypes; a libc without it, or a
kernel or sandbox (seccomp) that refuses it, leaves `into` returning False: the caller writes.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections import deque

_F_GETPIPE_SZ = 1032  # fcntl.h
_REFUSED = {errno.ENOSYS, errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP}


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _function():
    try:
        found = ctypes.CDLL(None, use_errno=True).vmsplice
    except (OSError, AttributeError):
        return None
    found.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_size_t, ctypes.c_uint]
    found.restype = ctypes.c_ssize_t
    return found


_vmsplice = _function()


def into(fd: int, view: memoryview) -> bool:
    """All of `view` (a writable buffer's) into the pipe `fd` by reference; False, with nothing sent,
    where vmsplice is missing or refused (write it instead); OSError (EPIPE: the reader is gone) as
    os.write raises it. The GIL is released while the call blocks on a full pipe."""
    if _vmsplice is None:
        return False
    base = ctypes.addressof(ctypes.c_char.from_buffer(view))
    done, size = 0, len(view)
    while done < size:
        sent = _vmsplice(fd, ctypes.byref(_IoVec(base + done, size - done)), 1, 0)
        if sent >= 0:
            done += sent
            continue
        code = ctypes.get_errno()
        if code == errno.EINTR:
            continue
        if done == 0 and code in _REFUSED:
            return False
        raise OSError(code, os.strerror(code))
    return True


def capacity(fd: int) -> int:
    """The pipe's size in bytes (F_GETPIPE_SZ): what it can hold at most, of pages written or spliced."""
    return fcntl.fcntl(fd, _F_GETPIPE_SZ)


class Pinned:
    """Buffers whose pages a pipe may still hold: each is free again once `capacity` bytes went into
    the pipe after it. A pipe holds at most capacity / page size buffers (its slots), a spliced page
    at most a page of bytes, so by then the reader has taken every page of it (a pipe is read in
    order; a writer waits while every slot is taken)."""

    def __init__(self, capacity: int):
        self.capacity, self.sent = capacity, 0
        self._held: deque[tuple[memoryview, int]] = deque()  # (buffer, self.sent once it was in)

    def add(self, buffer: memoryview, size: int) -> list[memoryview]:
        """`buffer` went in (`size` bytes of it); the buffers free again now, oldest first."""
        self.sent += size
        self._held.append((buffer, self.sent))
        free = []
        while self._held and self.sent - self._held[0][1] >= self.capacity:
            free.append(self._held.popleft()[0])
        return free
