"""Whether $PREBAKE_HOME can serve as the local store, checked once before a command touches it.

    check_home(home, write=False)   a command that only reads (stats, store ls, ls, plan, verify)
    check_home(home, write=True)    a command that installs, evicts or records (bake, gc)
    check_home(home, write=True, read_only_ok=True)   serve and fetch: a read-only store serves what it holds

A home that is a file, holds a file where a store folder belongs, cannot be created or (for a
writer) cannot be written raises StoreHomeError naming PREBAKE_HOME, what is wrong and the fix,
instead of an errno from deep inside or an empty store. A writer also claims the home as a
marked store (prebake.artifacts.store.mark).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from prebake.artifacts.errors import StoreFullError
from prebake.artifacts.fsutil import mib
from prebake.artifacts.store.mark import STORE_NAMES, StoreHomeError, check_readable, claim
from prebake.artifacts.store.settings import HOME_ENV
from prebake.artifacts.store.volume import warn_once

__all__ = ["STORE_FOLDERS", "check_home"]

# The folders the store keeps under its home (artifacts/store/local.py draws the tree).
STORE_FOLDERS = tuple(sorted(STORE_NAMES - {"prebake-store.json"}))
_DEFAULT = "~/.cache/prebake"


def check_home(home: Path, *, write: bool, read_only_ok: bool = False) -> None:
    """Raise StoreHomeError if `home` cannot be the store for a command that reads (or writes); with
    `read_only_ok` (serve, fetch), a read-only store is one warning line and the command reads it."""
    where = f"{HOME_ENV}={home}" if os.environ.get(HOME_ENV) else f"the store {home} ({HOME_ENV} is not set)"
    if home.exists() and not home.is_dir():
        raise StoreHomeError(
            f"{where} is a file, not a folder; point {HOME_ENV} at a folder (default {_DEFAULT}) or move the file away"
        )
    for name in STORE_FOLDERS:
        inner = home / name
        if inner.exists() and not inner.is_dir():
            raise StoreHomeError(
                f"{where} is not a prebake store: {inner} is a file where the store keeps a folder; "
                f"move it away, or point {HOME_ENV} at another folder"
            )
    if not write:
        check_readable(home)  # a newer prebake's store could be misread
        return
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreHomeError(
            f"cannot create {where}: {exc.strerror or exc}; point {HOME_ENV} at a folder you may write "
            f"(default {_DEFAULT})"
        ) from exc
    try:
        fd, probe = tempfile.mkstemp(prefix=".prebake-probe-", dir=home)
    except OSError as exc:
        if read_only_ok and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            check_readable(home)
            warn_once(
                home,
                "read-only",
                f"the store {home} is read-only ({exc.strerror}): serving what it holds, with no lease, stats, "
                f"lock or scratch file there; a miss is built in place in a scratch folder elsewhere",
            )
            return
        why = "is on a read-only file system" if exc.errno == errno.EROFS else f"cannot be written ({exc.strerror})"
        raise StoreHomeError(
            f"{where} {why}, and this command installs or records bundles there; point {HOME_ENV} at a "
            f"writable folder (default {_DEFAULT}), or mount it read-write (read-only homes serve "
            f"`prebake stats`, `prebake store ls` and `prebake ls`)"
        ) from exc
    os.close(fd)
    os.unlink(probe)
    try:
        claim(home)  # a registry, a newer prebake's store or someone's files: refused before anything is written
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise StoreFullError(
            f"the disk of the store {home} is full ({mib(shutil.disk_usage(home).free)} free): it cannot even be "
            f"marked as a store; free space on that disk, or point {HOME_ENV} at another, then run the same "
            f"command again"
        ) from exc
