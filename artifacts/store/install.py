"""Installing one bundle: its blob fetched and verified, unpacked into trees/<hex> whole (renamed in
once complete), then its lease and index entry; once per blob across processes (its install lock).

    install_bundle(paths, manifest, source, ...)   under locks/<hex>.lock: record, clean, unpack, index

A tree already here counts only if it was verified against the same file list (trees/<hex>.files);
a damaged one is fetched again. Room is checked before the download, from the manifest's sizes; a
disk that fills anyway (ENOSPC, EDQUOT) undoes what this install wrote and raises StoreFullError.
"""

from __future__ import annotations

import errno
import shutil
import threading
import time
from collections.abc import Callable

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import UnpackLimits, unpack
from prebake.artifacts.bundle.unpack import tree_problems, unpack_streamed
from prebake.artifacts.errors import BundleError, InstallElsewhereError, StoreError, StoreFullError
from prebake.artifacts.fsutil import mib
from prebake.artifacts.ports.registry import Registry
from prebake.artifacts.store import eviction, leases, mark, recovery, sealing
from prebake.artifacts.store.health import tree_damage
from prebake.artifacts.store.paths import StorePaths
from prebake.artifacts.store.settings import HOME_ENV

LOCK_POLL_S = 0.1  # how often an install told `until` tries the lock another process holds


def install_bundle(
    paths: StorePaths,
    manifest: Manifest,
    source: Registry,
    limits: UnpackLimits,
    deadline: float | None,
    while_locked: Callable[[], object] | None = None,
    until: threading.Event | None = None,
) -> None:
    """Install `manifest`'s bundle from `source` (the caller has claimed the home); `while_locked`
    runs last inside the install lock (a hold taken there cannot lose its tree to a gc). With
    `until`, another process's install of the blob is waited for only until it is set."""
    hexd, tree = manifest.blob.hex, paths.tree(manifest.blob.hex)
    with _install_lock(paths, hexd, until):
        had_tree = tree.is_dir()
        try:
            _install_locked(paths, manifest, source, limits, deadline, while_locked)
        except BaseException as exc:
            if not disk_full(exc):
                raise
            _undo_locked(paths, hexd, had_tree)
            raise StoreFullError(_full(paths, manifest, blob_needed=True)) from exc


def _install_lock(paths: StorePaths, hexd: str, until: threading.Event | None) -> fsutil.Flock:
    if until is None:
        return fsutil.Flock.hold(paths.install_lock(hexd))
    while (lock := fsutil.Flock.acquire(paths.install_lock(hexd), wait=False)) is None:
        if until.wait(LOCK_POLL_S):
            raise InstallElsewhereError(
                f"another process is installing blob {hexd[:12]} into {paths.home} and finishes its entry"
            )
    return lock


def _install_locked(
    paths: StorePaths,
    manifest: Manifest,
    source: Registry,
    limits: UnpackLimits,
    deadline: float | None,
    while_locked: Callable[[], object] | None,
) -> None:
    """Record, clean, unpack (or check the tree already here), lease, index; the install lock is held."""
    hexd, tree = manifest.blob.hex, paths.tree(manifest.blob.hex)
    mark.record_install(paths.home, hexd)  # before any byte of it lands: the store may delete it later
    recovery.remove_partials_locked(paths, hexd)
    if tree.is_dir() and tree_damage(tree, manifest) is not None:
        recovery.discard_damaged_locked(paths, hexd)  # a cleaner took files: fetch it whole again
    if tree.is_dir():
        _check_existing(paths, manifest)
    else:
        try:
            _unpack(paths, manifest, source, limits, deadline)
        except BaseException:
            recovery.forget_if_nothing_landed_locked(paths, hexd)  # a refused bundle leaves no record behind
            raise
    leases.lease_file(paths, hexd).touch(exist_ok=True)
    leases.touch(paths, hexd)
    fsutil.write_bytes(paths.index(manifest.kind, manifest.key_digest), manifest.to_bytes())
    if while_locked is not None:
        while_locked()


def disk_full(exc: BaseException) -> bool:
    """True if `exc`, or an error it was raised from, is a full disk or an exhausted quota."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _undo_locked(paths: StorePaths, hexd: str, had_tree: bool) -> None:
    """What a failed install of `hexd` wrote goes, so a reader sees the store as it was before and the
    room comes back: partial trees and downloads, its tree if this install made it, its blob and record."""
    recovery.remove_partials_locked(paths, hexd)
    if not had_tree:
        recovery.discard_damaged_locked(paths, hexd)
        paths.blob("sha256:" + hexd).unlink(missing_ok=True)
    recovery.forget_if_nothing_landed_locked(paths, hexd)


def _unpack(
    paths: StorePaths, manifest: Manifest, source: Registry, limits: UnpackLimits, deadline: float | None
) -> None:
    """The blob, streamed from `source` unless it is here already, unpacked into its tree; then the
    file list it was verified against is recorded beside it."""
    blob, tree = paths.blob(manifest.blob.digest), paths.tree(manifest.blob.hex)
    _check_room(paths, manifest, blob_needed=not blob.exists())
    what = f"blob {manifest.blob.digest[:23]} ({manifest.kind} {manifest.key_digest[:16]})"
    try:
        if blob.exists():
            unpack(blob, tree, manifest.files, limits=limits)
        else:
            download = lambda tee: source.fetch_blob(  # noqa: E731
                manifest.blob.digest, blob, size=manifest.blob.size, tee=_until(deadline, tee, what)
            )
            unpack_streamed(download, tree, manifest.files, limits, what)
    except Exception:
        blob.unlink(missing_ok=True)  # a bad blob must not be trusted on the next try
        raise
    sealing.seal(tree)  # read-only to every engine from here on; verified bytes stay verified
    fsutil.write_bytes(paths.files_record(manifest.blob.hex), manifest.files_digest().encode())


def _check_existing(paths: StorePaths, manifest: Manifest) -> None:
    """A tree already here counts for `manifest` only if it was verified against the same file list."""
    record, tree = paths.files_record(manifest.blob.hex), paths.tree(manifest.blob.hex)
    try:
        recorded = fsutil.read_bounded(record, 128).decode("ascii", "replace")
    except FileNotFoundError:  # unpacked by an older prebake, or killed before recording: check it whole
        problems = tree_problems(tree, manifest.files)
        if problems:
            raise BundleError(_disagrees(manifest, paths, f"its files differ: {problems[:3]}")) from None
        fsutil.write_bytes(record, manifest.files_digest().encode())
        return
    if recorded != manifest.files_digest():
        raise BundleError(_disagrees(manifest, paths, "its blob was verified against another file list"))


def _disagrees(manifest: Manifest, paths: StorePaths, why: str) -> str:
    return (
        f"{manifest.kind} {manifest.key_digest[:16]} names blob {manifest.blob.digest[:23]}, whose tree "
        f"{paths.tree(manifest.blob.hex)} does not match this manifest ({why}): the manifest disagrees with its "
        f"blob, it is corrupt or tampered; refusing it (run `prebake verify --deep` on the registry)"
    )


def _check_room(paths: StorePaths, manifest: Manifest, *, blob_needed: bool) -> None:
    """Refuse before downloading when the disk cannot hold what the manifest declares."""
    paths.home.mkdir(parents=True, exist_ok=True)
    if _need(manifest, blob_needed) > shutil.disk_usage(paths.home).free:
        raise StoreFullError(_full(paths, manifest, blob_needed=blob_needed))


def _need(manifest: Manifest, blob_needed: bool) -> int:
    return manifest.unpacked_bytes + 4096 * len(manifest.files) + (manifest.blob.size if blob_needed else 0)


def _full(paths: StorePaths, manifest: Manifest, *, blob_needed: bool) -> str:
    """The line a full disk prints: what the install needed, what was free, the gc bound that makes room."""
    need, free = _need(manifest, blob_needed), shutil.disk_usage(paths.home).free
    held = sum(e.bytes for e in eviction.entries(paths))
    bound = max(0, held - (need - free)) >> 20
    return (
        f"the disk of the store {paths.home} is full: installing {manifest.kind} {manifest.key_digest[:16]} needed "
        f"{mib(need)} (blob {mib(manifest.blob.size)}, files {mib(manifest.unpacked_bytes)}) and {mib(free)} was "
        f"free; nothing of it was left behind. Make room with `prebake store gc --max-size {bound}M` (the store "
        f"holds {mib(held)}), free space on that disk, or point {HOME_ENV} at a larger one; then run the same "
        f"command again"
    )


def _until(deadline: float | None, tee: Callable[[bytes], None], what: str) -> Callable[[bytes], None]:
    """`tee`, raising once `deadline` has passed: a download sent slowly (a byte every half second) ends at
    its time box instead of running on behind it, its unpacker waiting for it (and the process's exit, for that)."""
    if deadline is None:
        return tee

    def checked(chunk: bytes) -> None:
        if time.monotonic() > deadline:
            raise StoreError(f"{what}: still downloading when the fetch's time box ran out; nothing was installed")
        if chunk:  # no bytes: a backend's probe of the time box while its download runs out of sight
            tee(chunk)

    return checked
