"""Real small and read-only filesystems for the store's volume scenarios (tests/operations/test_volumes.py).

    tmpfs(path, size)        a tmpfs of `size` bytes mounted on `path` for the block (as root, as CI runs)
    resize(path, size)       the same tmpfs grown or shrunk in place (`mount -o remount,size=`)
    read_only(path)          `path` remounted read-only for the block, read-write again after
    can_mount()              whether this process may mount (root with CAP_SYS_ADMIN)

Where mounting is not permitted (a non-root developer's machine) the scenarios skip saying so; in
CI (root) they run, and `CI` set makes a refused mount fail instead of skip.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@functools.cache
def can_mount() -> str | None:
    """None if this process may mount a tmpfs, else why not."""
    with tempfile.TemporaryDirectory() as probe:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe], capture_output=True, text=True)
        if done.returncode != 0:
            return f"mount -t tmpfs is not permitted here ({done.stderr.strip() or done.returncode})"
        subprocess.run(["umount", probe], check=True)
    return None


def need_mount() -> None:
    """Skip (fail in CI) where this process may not mount."""
    why = can_mount()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI runs as root and must run the volume scenarios")
    pytest.skip(f"{why}: the volume scenarios need root (CI runs them)")


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


@contextmanager
def tmpfs(path: Path, size: int, *, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of `size` bytes (and at most `inodes` files and folders: a disk out of inodes) at `path`."""
    need_mount()
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
    _mount("-t", "tmpfs", "-o", options, "tmpfs", str(path))
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def resize(path: Path, size: int) -> None:
    _mount("-o", f"remount,size={size}", str(path))


@contextmanager
def read_only(path: Path) -> Iterator[Path]:
    _mount("-o", "remount,ro", str(path))
    try:
        yield path
    finally:
        _mount("-o", "remount,rw", str(path))
