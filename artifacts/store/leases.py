"""Leases: an engine holds leases/<blob-hex> shared (flock) for as long as it uses that tree; gc takes
it exclusive before evicting, so a held tree never goes. The lease's mtime is the bundle's last use,
which orders eviction (least recently used first).
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.store.paths import StorePaths
from prebake.artifacts.store.volume import warn_once


def lease_file(paths: StorePaths, hexd: str) -> Path:
    """The lease of blob `hexd`, its folder made (a lease file itself is made by install, never here)."""
    path = paths.lease(hexd)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def hold(paths: StorePaths, hexd: str, *, read_only: bool = False) -> fsutil.Flock | None:
    """Take `hexd`'s lease shared; release it when the tree is no longer used. On a read-only store
    (or a full disk without the lease file) an existing lease is held through a read-only open, else
    none is taken: None, and one warning, since the lease cannot be made there."""
    if not read_only:
        try:
            return fsutil.Flock.hold(lease_file(paths, hexd), shared=True)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
                raise
    held = fsutil.Flock.hold_existing(paths.lease(hexd))
    if held is None:
        warn_once(
            paths.home,
            "lease",
            f"the store {paths.home} cannot hold a lease on {hexd[:16]} (read-only or full): serving it "
            f"unleased; a gc run from another mount of this volume could evict it while in use",
        )
    return held


def touch(paths: StorePaths, hexd: str) -> None:
    """Record a use of blob `hexd` now (a lease that is gone: evicted meanwhile, nothing to record)."""
    now = time.time_ns()  # the kernel's file clock ticks too coarsely to order quick successive uses
    try:
        os.utime(paths.lease(hexd), ns=(now, now))
    except FileNotFoundError:
        pass
    except OSError as exc:  # a read-only store: its uses are not recorded (nothing there is evicted by us)
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise


def held(paths: StorePaths, hexd: str) -> bool:
    """True while a process holds blob `hexd`'s tree (or a gc is evicting it)."""
    return fsutil.Flock.is_held(paths.lease(hexd))
