"""The local store: bundles fetched onto this machine, verified and unpacked, safe for many processes.

    $PREBAKE_HOME/                                 (default ~/.cache/prebake)
    ├── prebake-store.json                         the mark: this folder is a store, of this format (store/mark.py)
    ├── installs/<blob-hex>                        this store installed that blob: the only bundles it ever deletes
    ├── registry/                                  the embedded default registry (index/ + blobs/); never evicted
    ├── index/<kind>/<key-digest>.json             manifests of bundles installed here, written after their tree
    ├── blobs/sha256/<aa>/<digest>.tar.zst         their payloads, as downloaded and verified
    ├── side/sha256/<aa>/<digest>/<name>           their attestations, as read for the trust policy
    ├── trees/<blob-hex>/ (+ <blob-hex>.files)     the unpacked payloads engines point at, renamed in once whole, read-only
    ├── caches/<blob-hex>/                         a tree's writable cache, for engines started from `prebake fetch`
    ├── leases/<blob-hex>                          engines hold it shared while they use the tree; mtime = last use
    ├── locks/<blob-hex>.lock, gc.lock, scratch-<name>.lock   one install, eviction or gc at a time; tmp/ owners
    ├── stats/                                     hit, miss and fallback counts (store/stats.py); never evicted
    ├── quarantine/index/<kind>/<key-digest>.json  damaged entries the hit path moved aside (store/health.py)
    ├── listing/                                   `prebake ls` summaries of Hub registries (registry/backends/hf.py)
    └── tmp/                                       scratch folders and evicted trees; nothing here is ever read

Store is the one door; each job has its module (settings, paths, install, leases, eviction, recovery,
scratch, sealing); the hit path and healing are here. Locks: flock(2), docs/operations.md.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import UnpackLimits
from prebake.artifacts.errors import StoreError, StoreReadOnlyError, StoreSharedError
from prebake.artifacts.ports.registry import Registry
from prebake.artifacts.store import eviction, leases, mark, recovery, volume
from prebake.artifacts.store.eviction import GcReport, Refuses, StoreEntry
from prebake.artifacts.store.health import Damaged, check_hit, quarantine
from prebake.artifacts.store.install import install_bundle
from prebake.artifacts.store.paths import StorePaths
from prebake.artifacts.store.scratch import Scratches
from prebake.artifacts.store.settings import HOME_ENV, MAX_BYTES_ENV, StoreLimits, absolute, default_home


@dataclass(frozen=True)
class Installed:
    """A bundle unpacked in the store: its manifest and the tree engines point at."""

    manifest: Manifest
    tree: Path


class Store:
    """One machine's store of verified, unpacked bundles."""

    def __init__(self, home: Path | str | None = None, limits: StoreLimits | None = None):
        self.home = absolute(home) if home else default_home()
        self.limits = limits if limits is not None else StoreLimits.from_env()
        self.paths = StorePaths(self.home)
        self._scratches = Scratches(self.paths)
        self._claimed = False
        self._readable = False
        self._read_only: bool | None = None

    @property
    def read_only(self) -> bool:
        """True on a read-only mount (or a home this process may not write): it serves what it holds,
        and installs, leases, records and scratches nothing there."""
        if self._read_only is None:
            self._read_only = not volume.writable(self.home)
        return self._read_only

    def claim(self) -> None:
        """Make sure the home is this store's to write and delete in (marking a new or legacy one);
        raises StoreHomeError (prebake.artifacts.store.mark) for a registry, a newer store or other files,
        StoreReadOnlyError for a read-only one, StoreSharedError on a network filesystem (store/volume.py)."""
        if not self._claimed:
            if self.read_only:
                raise StoreReadOnlyError(
                    f"the store {self.home} is read-only (a read-only mount, or not this user's to write): it "
                    f"serves what it holds and installs, evicts and records nothing; fill it from a writer "
                    f"(`prebake fetch` with {HOME_ENV} on a writable mount of this volume), or point {HOME_ENV} "
                    f"at a writable folder"
                )
            if (refusal := volume.shared_refusal(self.home)) is not None:
                raise StoreSharedError(refusal)
            mark.claim(self.home)
            self._claimed = True

    def check_readable(self) -> None:
        """Raise StoreHomeError for a store of a newer prebake, which this one could misread."""
        if not self._readable:
            mark.check_readable(self.home)
            self._readable = True

    @property
    def default_registry(self) -> Path:
        return self.home / "registry"

    # -- the hit path ----------------------------------------------------------------------

    def lookup(self, kind: str, key_digest: str) -> Installed | None:
        """The installed bundle for this key, if its tree is whole; counts as a use for eviction."""
        found = self.find(kind, key_digest)
        return found if isinstance(found, Installed) else None

    def find(self, kind: str, key_digest: str) -> Installed | Damaged | None:
        """`lookup`, saying why when the entry was there but damaged (it is then moved aside and
        its tree evicted, so the next install fetches the bundle again)."""
        self.check_readable()
        checked = check_hit(self.home, kind, key_digest)
        if isinstance(checked, Damaged):
            return self._heal(checked)
        if checked is None:
            return None
        manifest, tree = checked
        leases.touch(self.paths, manifest.blob.hex)
        return Installed(manifest, tree)

    def _heal(self, damaged: Damaged) -> Damaged:
        """Move a damaged entry aside and evict its tree; a tree a live process holds stays until the
        next install of its blob replaces it. An install of the blob running now heals it itself."""
        try:
            self.claim()
        except (mark.StoreHomeError, StoreReadOnlyError):  # not ours to move or delete in: the miss stands
            return damaged
        lock = None
        if damaged.blob_hex is not None:
            lock = fsutil.Flock.acquire(self.paths.install_lock(damaged.blob_hex), wait=False)
            if lock is None:
                return damaged
        try:
            if not isinstance(check_hit(self.home, damaged.kind, damaged.key_digest), Damaged):
                return damaged  # replaced by a whole one since it was read: nothing to move
            moved = quarantine(self.home, damaged.kind, damaged.key_digest)
            hexd = damaged.blob_hex
            if hexd is not None and mark.installed(self.home, hexd) and not self.held(hexd):
                recovery.discard_damaged_locked(self.paths, hexd)
        finally:
            if lock is not None:
                lock.release()
        return replace(damaged, moved_to=moved)

    # -- installing and holding ------------------------------------------------------------

    def install(
        self,
        manifest: Manifest,
        source: Registry,
        *,
        limits: UnpackLimits | None = None,
        hold: ExitStack | None = None,
        deadline: float | None = None,
        until: threading.Event | None = None,
    ) -> Installed:
        """Fetch, verify and unpack `manifest`'s blob from `source`, once per blob across processes,
        then evict least recently used bundles if the store is above its bound. With `hold`, the
        tree is held (`use`) on that stack from inside the install, so no gc evicts it before the
        caller lets go. With `deadline` (a time.monotonic() value), a download still running then stops at
        its next chunk: a fetch's time box ends the download itself, not only the wait for it. With
        `until`, another process installing the same blob is waited for until the event is set, then
        InstallElsewhereError (that process makes the entry)."""
        limits = limits or self.limits.unpack
        limits.check(manifest.files, f"{manifest.kind} {manifest.key_digest[:16]}")
        installed = Installed(manifest, self.tree_path(manifest))
        self.claim()
        take_hold = None if hold is None else (lambda: hold.enter_context(self.use(installed)))
        install_bundle(self.paths, manifest, source, limits, deadline, while_locked=take_hold, until=until)
        if self.limits.max_bytes is not None:
            self.gc(self.limits.max_bytes, keep=(manifest.blob.hex,), wait=False)  # a gc already running does it
        return installed

    @contextmanager
    def use(self, installed: Installed) -> Iterator[Installed]:
        """Hold `installed`'s tree for the block (an engine: for its life); gc never evicts a held tree.

        Raises StoreError if the tree was evicted between fetching and holding it: fetch again.
        """
        if installed.tree != self.tree_path(installed.manifest):
            raise StoreError(f"{installed.tree} is not a tree of the store in {self.home}; fetch through this store")
        hexd = installed.manifest.blob.hex
        lease = leases.hold(self.paths, hexd, read_only=self.read_only)
        try:
            if not installed.tree.is_dir():
                raise StoreError(
                    f"{installed.tree} ({installed.manifest.kind} {installed.manifest.key_digest[:16]}) was evicted "
                    f"before it could be held; fetch it again, and raise {MAX_BYTES_ENV} if this repeats"
                )
            leases.touch(self.paths, hexd)
            yield installed
        finally:
            leases.touch(self.paths, hexd)  # last use is when the engine let go
            if lease is not None:
                lease.release()

    def held(self, hexd: str) -> bool:
        """True while a process holds blob `hexd`'s tree with `use` (or a gc is evicting it)."""
        return leases.held(self.paths, hexd)

    # -- evicting and recovering -----------------------------------------------------------

    def gc(
        self,
        max_bytes: int,
        *,
        keep: Collection[str] = (),
        wait: bool = True,
        dry_run: bool = False,
        refuse: Refuses | None = None,
    ) -> GcReport | None:
        """Evict least recently used bundles until blobs/ + trees/ fit in `max_bytes`, skipping
        held trees and the blob digests (hex) in `keep`. None if `wait` is False and a gc is running.
        With `dry_run`, remove nothing and report what would go. With `refuse` (the trust policy in
        force), a bundle every index entry of which it refuses is not in use by any start to come:
        it goes first, whatever the bound (unless a live engine holds it)."""
        if max_bytes < 0:
            raise StoreError(f"a store bound of {max_bytes} bytes makes no sense; give 0 or more")
        if dry_run:
            self.check_readable()
            return eviction.gc_plan(self.paths, max_bytes, keep, refuse)
        self.claim()
        lock = fsutil.Flock.acquire(self.paths.gc_lock(), wait=wait)
        if lock is None:
            return None
        with lock:
            return eviction.gc(self.paths, max_bytes, keep, refuse)

    def entries(self) -> list[StoreEntry]:
        """Every bundle in blobs/ or trees/, least recently used first."""
        return eviction.entries(self.paths)

    def evict(self, entry: StoreEntry) -> bool:
        """Remove one bundle (index entries, tree, blob) unless it is being installed or is held; True if it went."""
        self.claim()
        return eviction.evict(self.paths, entry)

    def recover(self) -> int:
        """Remove what crashed runs left behind; return how many leftovers went. Safe while other
        processes install, use and evict: nothing a live process owns is touched, nor anything of a
        blob this store did not install."""
        self.claim()
        return recovery.recover(self.paths)

    # -- paths and scratch -----------------------------------------------------------------

    def tree_path(self, manifest: Manifest) -> Path:
        return self.paths.tree(manifest.blob.hex)

    def cache_path(self, manifest: Manifest) -> Path:
        """The writable cache beside `manifest`'s tree (StorePaths.cache); made by the engine that seeds it."""
        return self.paths.cache(manifest.blob.hex)

    def blob_path(self, digest: str) -> Path:
        return self.paths.blob(digest)

    def release_scratch(self, path: Path) -> None:
        """Let go of the lock of this process's scratch folder `path`, leaving its files (a process
        about to be snapshotted holds no lock file, and keeps what it mapped from there:
        prebake.engine.bundled.snapshot); ownerless, a later sweep removes it."""
        self._scratches.release(path)

    def scratch(self, name: str) -> Path:
        """A fresh private folder under tmp/ for a build or download in progress, owned by this
        process until the folder is removed; folders of owners that died go on the way. On a read-only
        store, or one with less than volume.SCRATCH_MIN_FREE free, it is made in the system's temporary
        folder instead (one warning): a compile in place still has room, and the store stays as it is."""
        if self.read_only or not volume.roomy(self.home):
            return self._scratches.elsewhere(name, "read-only" if self.read_only else "nearly full")
        self.claim()
        recovery.sweep_tmp(self.paths)
        return self._scratches.take(name)
