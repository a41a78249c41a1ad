"""Atomic file operations: readers see a whole file or none, never a partial one.

Every write goes to a temporary name in the destination's folder, is flushed and
fsynced, and is then renamed (or hard-linked, for create-only) into place. A crash at
any point leaves at most a `.tmp-*` file that `sweep_temporaries` removes later.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_PREFIX = ".tmp-"


@contextmanager
def atomic_target(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; on success rename it over `dest`, else remove it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX + dest.name + ".", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(dest: Path, data: bytes) -> None:
    with atomic_target(dest) as tmp:
        tmp.write_bytes(data)


def copy_file(src: Path, dest: Path) -> None:
    with atomic_target(dest) as tmp:
        shutil.copyfile(src, tmp)


def create_only(dest: Path, data: bytes) -> bool:
    """Write `dest` only if it does not exist yet; True if this call created it.

    A hard link from a complete temporary file is atomic and fails if the name exists,
    which makes this a conditional put on any local POSIX file system (not on NFS).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX + dest.name + ".", dir=dest.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, dest)
        except FileExistsError:
            return False
        _fsync_dir(dest.parent)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def sweep_temporaries(root: Path, older_than_s: float = 3600.0) -> int:
    """Remove temporaries left by crashed writers (older than the grace period); return the count."""
    if not root.exists():
        return 0
    cutoff, removed = time.time() - older_than_s, 0
    for path in root.rglob(TMP_PREFIX + "*"):
        try:
            if path.lstat().st_mtime < cutoff:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
