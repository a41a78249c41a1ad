"""The file pages a parked process had mapped, mapped again once restored, before it says ready.

CRIU restores a private file mapping (a library's code, AOTInductor's .so files, weights read by
mmap) by mapping the file again: only the pages the process wrote come from the image, so the pages
it had only read would fault back in at the first request, where a prebaked start paid them in its
warm-up (docs/snapshots.md). So the parked process records them, and the restored one maps them.

    record()         runs of present pages in readable file mappings: /proc/self/maps, and
                     /proc/self/pagemap's present bit (bit 63; no privilege needed)
    populate(pages)  madvise(MADV_POPULATE_READ) on each run (Linux 5.14), inside the time to
                     ready; what it did, as a value
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import time
from dataclasses import dataclass

PAGE = os.sysconf("SC_PAGE_SIZE")
MADV_POPULATE_READ = 22
_PRESENT = bytes(1 if b & 0x80 else 0 for b in range(256))  # bit 63 is the top bit of an entry's last byte
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \d+ +(/.*)$")


@dataclass(frozen=True)
class ResidentPages:
    """Runs of present pages, (address, bytes) each, in the file mappings of the process that recorded them."""

    runs: tuple[tuple[int, int], ...]

    @property
    def bytes(self) -> int:
        return sum(length for _, length in self.runs)


@dataclass(frozen=True)
class Populated:
    bytes: int
    seconds: float
    failed: str | None = None  # why some runs were not made present (they fault in when used)

    def line(self) -> str:
        done = f"{self.bytes / 1e6:.1f} MB of mapped file pages made present again in {self.seconds:.3f} s"
        return f"prebake serve: snapshot: {done}" + (f" ({self.failed})" if self.failed else "")


def record() -> ResidentPages:
    """The present pages of this process's readable file mappings (not devices, not deleted files)."""
    runs: list[tuple[int, int]] = []
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for line in maps:
            match = _MAPPING.match(line.rstrip("\n"))
            if match is None or match[3][0] != "r" or match[4].startswith("/dev/") or match[4].endswith("(deleted)"):
                continue
            start, end = int(match[1], 16), int(match[2], 16)
            runs += _present_runs(pagemap, start, end)
    return ResidentPages(tuple(runs))


def _present_runs(pagemap, start: int, end: int) -> list[tuple[int, int]]:
    entries = os.pread(pagemap.fileno(), (end - start) // PAGE * 8, start // PAGE * 8)
    present = entries[7::8].translate(_PRESENT)
    return [
        (start + found.start() * PAGE, (found.end() - found.start()) * PAGE) for found in re.finditer(b"\x01+", present)
    ]


def populate(pages: ResidentPages) -> Populated:
    """Map every run again (a no-op for pages present already); a run that fails is skipped, said once."""
    started = time.perf_counter()
    madvise = _madvise()
    done, failed = 0, None
    for address, length in pages.runs:
        if madvise(address, length, MADV_POPULATE_READ) == 0:
            done += length
            continue
        code = ctypes.get_errno()
        if code == errno.EINVAL:  # before Linux 5.14: nothing to try the other runs with
            failed = "this kernel has no MADV_POPULATE_READ (Linux 5.14): the first requests fault them in"
            break
        failed = f"some not: {os.strerror(code)}"
    return Populated(done, time.perf_counter() - started, failed)


def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise.restype = ctypes.c_int
    return libc.madvise
