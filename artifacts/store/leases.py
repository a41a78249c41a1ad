"""Leases: an engine holds leases/<blob-hex> shared (flock) for as long as it uses that tree; gc takes
it exclusive before evicting, so a held tree never goes. The lease's mtime is the bundle's last use,
which orders eviction (least recently used first).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.store.paths import StorePaths


def lease_file(paths: StorePaths, hexd: str) -> Path:
    """The lease of blob `hexd`, its folder made (a lease file itself is made by install, never here)."""
    path = paths.lease(hexd)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def hold(paths: StorePaths, hexd: str) -> fsutil.Flock:
    """Take `hexd`'s lease shared; release it when the tree is no longer used."""
    return fsutil.Flock.hold(lease_file(paths, hexd), shared=True)


def touch(paths: StorePaths, hexd: str) -> None:
    """Record a use of blob `hexd` now (a lease that is gone: evicted meanwhile, nothing to record)."""
    now = time.time_ns()  # the kernel's file clock ticks too coarsely to order quick successive uses
    try:
        os.utime(paths.lease(hexd), ns=(now, now))
    except FileNotFoundError:
        pass


def held(paths: StorePaths, hexd: str) -> bool:
    """True while a process holds blob `hexd`'s tree (or a gc is evicting it)."""
    return fsutil.Flock.is_held(paths.lease(hexd))
