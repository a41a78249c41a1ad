"""Scratch folders: tmp/<name>, private to one process while it builds or downloads there, owned
through locks/scratch-<name>.lock; recovery deletes the folder of an owner that died. A store that
cannot hold one (read-only, nearly full) gets one in the system's temporary folder instead, owned
through a lock beside it; the next such folder made there removes those whose owner died.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.errors import StoreError
from prebake.artifacts.store.paths import StorePaths
from prebake.artifacts.store.volume import warn_once


class Scratches:
    """The scratch folders this process owns in one store, with their locks."""

    def __init__(self, paths: StorePaths):
        self.paths = paths
        self._owned: dict[Path, fsutil.Flock] = {}

    def take(self, name: str) -> Path:
        """A fresh tmp/<name>, owned by this process until the folder is removed."""
        self.release_finished()
        lock = fsutil.Flock.acquire(self.paths.scratch_lock(name), wait=False)
        path = self.paths.tmp / name
        if lock is None:
            raise StoreError(f"{path} is in use by another build; wait for it to finish")
        shutil.rmtree(path, ignore_errors=True)  # a crashed owner's leftover: we hold its lock now
        path.mkdir(parents=True)
        self._owned[path] = lock
        return path

    def elsewhere(self, name: str, why: str) -> Path:
        """A fresh private folder in the system's temporary folder, for a store that is `why` (read-only,
        nearly full); removed by its owner as a store scratch is, or by a later one once the owner died."""
        self.release_finished()
        sweep_elsewhere(Path(tempfile.gettempdir()))
        path = Path(tempfile.mkdtemp(prefix=f"{ELSEWHERE_PREFIX}{name}-"))
        lock = fsutil.Flock.acquire(_owner_lock(path), wait=False)
        assert lock is not None  # a fresh name: nobody else can hold its lock
        self._owned[path] = lock
        warn_once(
            self.paths.home,
            "read-only" if why == "read-only" else "scratch",  # a read-only store said it once already
            f"the store {self.paths.home} is {why}: scratch folders (a compile in place) go to {path.parent}",
        )
        return path

    def release(self, path: Path) -> None:
        """Let go of `path`'s lock and leave the folder: ownerless, a later sweep removes it."""
        lock = self._owned.pop(path, None)
        if lock is not None:
            lock.release(unlink=True)

    def release_finished(self) -> None:
        for path in [p for p in self._owned if not p.exists()]:
            self._owned.pop(path).release(unlink=True)


ELSEWHERE_PREFIX, _OWNER_LOCK = "prebake-", ".owner.lock"


def _owner_lock(folder: Path) -> Path:
    return folder.with_name(folder.name + _OWNER_LOCK)


def sweep_elsewhere(temp: Path) -> int:
    """Remove the scratch folders in `temp` whose owner died (their lock beside them is free); how many.
    A folder without such a lock (another program's, or one being made) is left alone."""
    removed = 0
    for lock_path in temp.glob(f"{ELSEWHERE_PREFIX}*{_OWNER_LOCK}"):
        lock = fsutil.Flock.acquire(lock_path, wait=False)
        if lock is None:  # its owner is alive
            continue
        shutil.rmtree(lock_path.with_name(lock_path.name.removesuffix(_OWNER_LOCK)), ignore_errors=True)
        lock.release(unlink=True)
        removed += 1
    return removed


def remove_leftover(paths: StorePaths, path: Path) -> int:
    """Remove `path` under tmp/ if it is a scratch folder whose owner died (1), else leave it (0)."""
    lock_path = paths.scratch_lock(path.name)
    if not lock_path.exists():  # not a scratch folder this store made (`take` takes its lock first)
        return 0
    lock = fsutil.Flock.acquire(lock_path, wait=False)
    if lock is None:  # its owner is alive
        return 0
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    lock.release(unlink=True)
    return 1
