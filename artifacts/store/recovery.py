"""What crashed runs leave behind, and damaged trees, removed safely while other processes work.

    partial trees and downloads   trees/.<hex>.*.partial, blobs/sha256/<aa>/.tmp-<hex>.tar.zst.*
    evicted trees                 tmp/.evicted-<hex>-<ns> (a gc died before deleting them)
    scratch folders               tmp/<name> whose owner died (store/scratch.py)
    stray records                 installs/<hex> and leases/<hex> of a blob with no tree
    dangling index entries        index/ entries naming no tree; unreadable ones go to quarantine/

Every step takes the blob's install lock without waiting, so nothing a live process owns is
touched, and nothing of a blob this store did not install (store/mark.py).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.layout import parse_index_relpath
from prebake.artifacts.store import mark, sealing
from prebake.artifacts.store.health import quarantine
from prebake.artifacts.store.paths import EVICTED, HEX, StorePaths, is_hex, named_blob
from prebake.artifacts.store.scratch import remove_leftover

_PARTIAL_TREE = re.compile(rf"^\.({HEX})\..*\.partial$")  # bundle.unpack's temporary folder
_PARTIAL_BLOB = re.compile(rf"^{re.escape(fsutil.TMP_PREFIX)}({HEX})\.tar\.zst\.")  # fsutil.atomic_target's
_INDEX_TMP_GRACE_S = 600.0  # an index write takes milliseconds; an older temporary is a crash's


def recover(paths: StorePaths) -> int:
    """Remove what crashed runs left behind; return how many leftovers went (the caller has claimed the home)."""
    leftovers = paths.glob("trees/.*.partial", "blobs/sha256/*/.tmp-*")
    hexes = {m[1] for p in leftovers if (m := _PARTIAL_TREE.match(p.name) or _PARTIAL_BLOB.match(p.name))}
    hexes = {h for h in hexes if mark.installed(paths.home, h)}
    removed = sum(_remove_partials(paths, h) for h in hexes) + sweep_tmp(paths)
    for record in paths.glob(f"{mark.INSTALLS}/*"):
        removed += _drop_stray_record(paths, record.name)
    for lease in paths.glob("leases/*"):
        removed += _drop_stray_lease(paths, lease.name)
    for cache in paths.glob("caches/*"):  # a gc killed between a tree and its cache, or a mounted tree's
        if not paths.tree(cache.name).is_dir():
            sealing.remove(cache)
            removed += 1
    removed += fsutil.sweep_temporaries(paths.home / "index", older_than_s=_INDEX_TMP_GRACE_S)
    return removed


def remove_partials_locked(paths: StorePaths, hexd: str) -> int:
    """Remove partial trees and downloads of `hexd`; the caller holds its install lock, so
    any there belong to an install that died."""
    leftovers = paths.glob(f"trees/.{hexd}.*.partial", f"blobs/sha256/{hexd[:2]}/{fsutil.TMP_PREFIX}{hexd}.tar.zst.*")
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return len(leftovers)


def discard_damaged_locked(paths: StorePaths, hexd: str) -> None:
    """A damaged tree goes (one rename into tmp/), with its blob and file-list record, so the next
    install streams the bundle again from the registry; the caller holds `hexd`'s install lock."""
    trash = paths.trash(hexd, time.time_ns())
    trash.parent.mkdir(parents=True, exist_ok=True)
    try:
        sealing.open_top(paths.tree(hexd))
        os.replace(paths.tree(hexd), trash)
    except FileNotFoundError:
        return
    paths.files_record(hexd).unlink(missing_ok=True)
    paths.blob("sha256:" + hexd).unlink(missing_ok=True)
    sealing.remove(trash)


def forget_if_nothing_landed_locked(paths: StorePaths, hexd: str) -> None:
    """The installs/ record of a failed install whose tree and blob are both gone (install lock held)."""
    if not paths.tree(hexd).exists() and not paths.blob("sha256:" + hexd).exists():
        (paths.home / mark.INSTALLS / hexd).unlink(missing_ok=True)


def drop_dangling(paths: StorePaths, index: Path, hexd: str | None) -> int:
    """Remove an index entry that names no tree (a crashed gc's, of a blob this store installed);
    one that cannot be read is moved into quarantine/ for whoever investigates, never deleted."""
    if hexd is None:
        parsed = parse_index_relpath(index.relative_to(paths.home).as_posix())
        return int(parsed is not None and quarantine(paths.home, *parsed) is not None)
    lock = fsutil.Flock.acquire(paths.install_lock(hexd), wait=False)
    if lock is None:  # being installed right now: its tree is on the way
        return 0
    with lock:
        if paths.tree(hexd).is_dir() or named_blob(index) != hexd:
            return 0
        index.unlink(missing_ok=True)
    return 1


def sweep_tmp(paths: StorePaths) -> int:
    """Remove evicted trees and the scratch folders of owners that died; no one else reads tmp/."""
    tmp = paths.tmp
    return sum(_remove_tmp_leftover(paths, p) for p in sorted(tmp.iterdir())) if tmp.is_dir() else 0


def _remove_tmp_leftover(paths: StorePaths, path: Path) -> int:
    if path.name.startswith(EVICTED):  # a gc died before deleting it
        sealing.remove(path)
        return 1
    return remove_leftover(paths, path)


def _remove_partials(paths: StorePaths, hexd: str) -> int:
    """Remove leftovers of crashed installs of `hexd`, unless an install of it is running."""
    lock = fsutil.Flock.acquire(paths.install_lock(hexd), wait=False)
    if lock is None:
        return 0
    with lock:
        return remove_partials_locked(paths, hexd)


def _drop_stray_lease(paths: StorePaths, hexd: str) -> int:
    """A lease whose tree is gone: made by a `use` that came too late, or left by a killed gc."""
    if paths.tree(hexd).is_dir() or not is_hex(hexd):
        return 0
    install = fsutil.Flock.acquire(paths.install_lock(hexd), wait=False)
    if install is None:  # being installed: its lease is about to be used
        return 0
    with install:
        lease = fsutil.Flock.acquire(paths.lease(hexd), wait=False)
        if lease is None:
            return 0
        gone = not paths.tree(hexd).is_dir()
        lease.release(unlink=gone)
    return int(gone)


def _drop_stray_record(paths: StorePaths, hexd: str) -> int:
    """An installs/ record whose tree and blob are both gone: left by a gc killed before its last step."""
    if not is_hex(hexd):
        return 0
    install = fsutil.Flock.acquire(paths.install_lock(hexd), wait=False)
    if install is None:  # being installed: the record comes before the blob
        return 0
    with install:
        gone = not paths.tree(hexd).exists() and not paths.blob("sha256:" + hexd).exists()
        forget_if_nothing_landed_locked(paths, hexd)
    return int(gone)
