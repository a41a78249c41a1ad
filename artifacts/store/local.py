"""The local store: bundles fetched onto this machine, verified and unpacked, safe for many processes.

    $PREBAKE_HOME/                                 (default ~/.cache/prebake)
    ├── prebake-store.json                         the mark: this folder is a store, of this format (store/mark.py)
    ├── installs/<blob-hex>                        this store installed that blob: the only bundles it ever deletes
    ├── registry/                                  the embedded default registry (index/ + blobs/); never evicted
    ├── index/<kind>/<key-digest>.json             manifests of bundles installed here, written after their tree
    ├── blobs/sha256/<aa>/<digest>.tar.zst         their payloads, as downloaded and verified
    ├── side/sha256/<aa>/<digest>/<name>           their attestations, as read for the trust policy
    ├── trees/<blob-hex>/ (+ <blob-hex>.files)     the unpacked payloads engines point at, renamed in once whole
    ├── leases/<blob-hex>                          engines hold it shared while they use the tree; mtime = last use
    ├── locks/<blob-hex>.lock, gc.lock, scratch-<name>.lock   one install, eviction or gc at a time; tmp/ owners
    ├── stats/                                     hit, miss and fallback counts (store/stats.py); never evicted
    ├── quarantine/index/<kind>/<key-digest>.json  damaged entries the hit path moved aside (store/health.py)
    ├── listing/                                   `prebake ls` summaries of Hub registries (registry/backends/hf.py)
    └── tmp/                                       scratch folders and evicted trees; nothing here is ever read

Bounded by DEFAULT_MAX_BYTES (sccache's default) or PREBAKE_STORE_MAX_BYTES, least recently used
first; evicts in the reverse order of installing. Locks are flock(2): keep it on local disk, not
NFS. What a crash leaves and what it deletes: docs/trust-and-failure.md, docs/operations.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.bundle.payload import UnpackLimits, unpack
from prebake.artifacts.bundle.unpack import tree_problems, unpack_streamed
from prebake.artifacts.errors import BundleError, StoreError
from prebake.artifacts.layout import blob_relpath, index_relpath, parse_index_relpath
from prebake.artifacts.ports.registry import Registry
from prebake.artifacts.store import mark
from prebake.artifacts.store.health import Damaged, check_hit, quarantine, tree_damage
from prebake.artifacts.store.overlap import check_apart

HOME_ENV = "PREBAKE_HOME"
REGISTRY_ENV = "PREBAKE_REGISTRY"
MAX_BYTES_ENV = "PREBAKE_STORE_MAX_BYTES"
UNPACK_MAX_BYTES_ENV = "PREBAKE_UNPACK_MAX_BYTES"
DEFAULT_MAX_BYTES = 10 * 1024**3  # the store's bound when PREBAKE_STORE_MAX_BYTES is not set (sccache's 10 GiB)

_HEX = "[0-9a-f]{64}"
_PARTIAL_TREE = re.compile(rf"^\.({_HEX})\..*\.partial$")  # bundle.unpack's temporary folder
_PARTIAL_BLOB = re.compile(rf"^{re.escape(fsutil.TMP_PREFIX)}({_HEX})\.tar\.zst\.")  # fsutil.atomic_target's
_EVICTED = ".evicted-"
_INDEX_TMP_GRACE_S = 600.0  # an index write takes milliseconds; an older temporary is a crash's

# The trust policy in force (prebake.artifacts.ports.registry.TrustCheck): why a manifest is refused, or None.
Refuses = Callable[[Manifest], "str | None"]


def default_home(env: Mapping[str, str] = os.environ) -> Path:
    """$PREBAKE_HOME (made absolute: a relative one would move with the working folder), else ~/.cache/prebake."""
    return absolute(env.get(HOME_ENV) or Path.home() / ".cache" / "prebake")


def absolute(path: Path | str) -> Path:
    """`path` with ~ expanded, made absolute against the working folder and normalised (no `..`);
    links are kept, so the path stays the one the operator named."""
    return Path(os.path.abspath(Path(path).expanduser()))


def parse_size(text: str, what: str = "size") -> int:
    """Bytes from '5000000', '10M', '2G', '1.5GiB': K, M, G and T are powers of 1024."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not match:
        raise StoreError(f"{what} {text!r} is not a size; write bytes or a number with K, M, G or T, e.g. 10G")
    return int(float(match[1]) * 1024 ** " KMGT".index(match[2].upper() or " "))


@dataclass(frozen=True)
class StoreLimits:
    """How large the store may grow (None: unbounded, for tests and tools) and how far one archive may
    unpack. From the environment it is always bounded: PREBAKE_STORE_MAX_BYTES, else DEFAULT_MAX_BYTES."""

    max_bytes: int | None = None
    unpack: UnpackLimits = UnpackLimits()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> StoreLimits:
        raw_max, raw_unpack = env.get(MAX_BYTES_ENV), env.get(UNPACK_MAX_BYTES_ENV)
        unpack_limits = (
            UnpackLimits(max_bytes=parse_size(raw_unpack, UNPACK_MAX_BYTES_ENV)) if raw_unpack else UnpackLimits()
        )
        return cls(parse_size(raw_max, MAX_BYTES_ENV) if raw_max else DEFAULT_MAX_BYTES, unpack_limits)


@dataclass(frozen=True)
class Installed:
    """A bundle unpacked in the store: its manifest and the tree engines point at."""

    manifest: Manifest
    tree: Path


@dataclass(frozen=True)
class GcReport:
    """What one gc did: the store's size before and after, what went and what was held."""

    max_bytes: int
    before_bytes: int
    after_bytes: int
    evicted: tuple[str, ...]  # blob hex digests
    in_use: tuple[str, ...]  # would have gone, but a process holds them
    recovered: int  # leftovers of crashed runs removed
    dry_run: bool = False  # nothing was removed: `evicted` is what would have gone
    refused: tuple[str, ...] = ()  # blobs the trust policy in force refuses: evicted whatever the bound

    def render(self) -> str:
        verb = "would be evicted (dry run)" if self.dry_run else "evicted"
        lines = [
            f"gc: {_mib(self.before_bytes)} -> {_mib(self.after_bytes)} (bound {_mib(self.max_bytes)}): "
            f"{len(self.evicted)} bundle(s) {verb}, {len(self.in_use)} kept because in use, "
            f"{self.recovered} leftover(s) of crashed runs removed"
        ]
        lines += [f"  {'would evict' if self.dry_run else 'evicted'} {h[:16]}" for h in self.evicted]
        lines += [f"  in use  {h[:16]}" for h in self.in_use]
        lines += [
            f"  refused {h[:16]} by the trust policy in force: no start uses it"
            + (" (held by an engine started before; restart it)" if h in self.in_use else "")
            for h in self.refused
        ]
        if self.after_bytes > self.max_bytes:
            lines.append("  still above the bound: the rest is in use; run gc again when those engines stop")
        return "\n".join(lines)


@dataclass(frozen=True)
class StoreEntry:
    """One evictable bundle: its blob and/or tree, their bytes, when it was last used, the index
    entries naming it."""

    hex: str
    bytes: int
    last_use_ns: int
    index: tuple[Path, ...] = field(default=())


class Store:
    """One machine's store of verified, unpacked bundles."""

    def __init__(self, home: Path | str | None = None, limits: StoreLimits | None = None):
        self.home = absolute(home) if home else default_home()
        self.limits = limits if limits is not None else StoreLimits.from_env()
        self._scratches: dict[Path, fsutil.Flock] = {}
        self._claimed = False
        self._readable = False

    def claim(self) -> None:
        """Make sure the home is this store's to write and delete in (marking a new or legacy one);
        raises StoreHomeError (prebake.artifacts.store.mark) for a registry, a newer store or other files."""
        if not self._claimed:
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

    def registry_address(self, explicit: str | None = None, env: Mapping[str, str] = os.environ) -> str:
        """The registry to use: the explicit one, else $PREBAKE_REGISTRY, else the embedded folder.
        Raises StoreOverlapError for a folder registry that shares the store's folder (prebake.artifacts.store.overlap)."""
        address = explicit or env.get(REGISTRY_ENV) or str(self.default_registry)
        check_apart(self.home, address, embedded=self.default_registry)
        return address

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
        self._touch(manifest.blob.hex)
        return Installed(manifest, tree)

    def install(
        self,
        manifest: Manifest,
        source: Registry,
        *,
        limits: UnpackLimits | None = None,
        hold: ExitStack | None = None,
        deadline: float | None = None,
    ) -> Installed:
        """Fetch, verify and unpack `manifest`'s blob from `source`, once per blob across processes,
        then evict least recently used bundles if the store is above its bound. With `hold`, the
        tree is held (`use`) on that stack from inside the install, so no gc evicts it before the
        caller lets go. With `deadline` (a time.monotonic() value), a download still running then stops at
        its next chunk: a fetch's time box ends the download itself, not only the wait for it."""
        hexd, tree = manifest.blob.hex, self.tree_path(manifest)
        limits = limits or self.limits.unpack
        limits.check(manifest.files, f"{manifest.kind} {manifest.key_digest[:16]}")
        installed = Installed(manifest, tree)
        self.claim()
        with fsutil.Flock.hold(self._install_lock(hexd)):
            mark.record_install(self.home, hexd)  # before any byte of it lands: the store may delete it later
            self._remove_partials_locked(hexd)
            if tree.is_dir() and tree_damage(tree, manifest) is not None:
                self._discard_damaged_locked(hexd)  # a cleaner took files: fetch it whole again
            if tree.is_dir():
                self._check_existing(manifest, tree)
            else:
                try:
                    self._unpack(manifest, source, tree, limits, deadline)
                except BaseException:
                    self._forget_if_nothing_landed_locked(hexd)  # a refused bundle leaves no record behind
                    raise
            self._lease(hexd).touch(exist_ok=True)
            self._touch(hexd)
            fsutil.write_bytes(self.home / index_relpath(manifest.kind, manifest.key_digest), manifest.to_bytes())
            if hold is not None:  # inside the install lock: no gc can evict it before the hold is taken
                hold.enter_context(self.use(installed))
        if self.limits.max_bytes is not None:
            self.gc(self.limits.max_bytes, keep=(hexd,), wait=False)  # a gc already running does the work
        return installed

    @contextmanager
    def use(self, installed: Installed) -> Iterator[Installed]:
        """Hold `installed`'s tree for the block (an engine: for its life); gc never evicts a held tree.

        Raises StoreError if the tree was evicted between fetching and holding it: fetch again.
        """
        if installed.tree != self.tree_path(installed.manifest):
            raise StoreError(f"{installed.tree} is not a tree of the store in {self.home}; fetch through this store")
        hexd = installed.manifest.blob.hex
        lease = fsutil.Flock.hold(self._lease(hexd), shared=True)
        try:
            if not installed.tree.is_dir():
                raise StoreError(
                    f"{installed.tree} ({installed.manifest.kind} {installed.manifest.key_digest[:16]}) was evicted "
                    f"before it could be held; fetch it again, and raise {MAX_BYTES_ENV} if this repeats"
                )
            self._touch(hexd)
            yield installed
        finally:
            self._touch(hexd)  # last use is when the engine let go
            lease.release()

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
            return self._gc_plan(max_bytes, keep, refuse)
        self.claim()
        lock = fsutil.Flock.acquire(self.home / "locks" / "gc.lock", wait=wait)
        if lock is None:
            return None
        with lock:
            recovered = self.recover()
            entries, dangling = self._inventory()
            recovered += sum(self._drop_dangling(path, hexd) for path, hexd in dangling)
            refused = _refused(entries, refuse)
            entries.sort(key=lambda e: e.hex not in refused)  # stable: refused first, then least recently used
            before = total = sum(e.bytes for e in entries)
            evicted, in_use = [], []
            for entry in entries:
                if total <= max_bytes and entry.hex not in refused:
                    break
                if entry.hex in keep:
                    continue
                if self.evict(entry):
                    evicted.append(entry.hex)
                    total -= entry.bytes
                else:
                    in_use.append(entry.hex)
        return GcReport(max_bytes, before, total, tuple(evicted), tuple(in_use), recovered, refused=tuple(refused))

    def _gc_plan(self, max_bytes: int, keep: Collection[str], refuse: Refuses | None) -> GcReport:
        entries = self.inventory()
        refused = _refused(entries, refuse)
        entries.sort(key=lambda e: e.hex not in refused)
        before = total = sum(e.bytes for e in entries)
        evicted, in_use = [], []
        for entry in (e for e in entries if e.hex not in keep):
            if total <= max_bytes and entry.hex not in refused:
                break
            if self.held(entry.hex):
                in_use.append(entry.hex)
            else:
                evicted.append(entry.hex)
                total -= entry.bytes
        return GcReport(
            max_bytes, before, total, tuple(evicted), tuple(in_use), 0, dry_run=True, refused=tuple(refused)
        )

    def inventory(self) -> list[StoreEntry]:
        """Every bundle in blobs/ or trees/, least recently used first."""
        return self._inventory()[0]

    def held(self, hexd: str) -> bool:
        """True while a process holds blob `hexd`'s tree with `use` (or a gc is evicting it)."""
        return fsutil.Flock.is_held(self.home / "leases" / hexd)

    def recover(self) -> int:
        """Remove what crashed runs left behind; return how many leftovers went. Safe while other
        processes install, use and evict: nothing a live process owns is touched, nor anything of a
        blob this store did not install."""
        self.claim()
        hexes = {m[1] for p in self._glob("trees/.*.partial", "blobs/sha256/*/.tmp-*") if (m := _leftover(p.name))}
        hexes = {h for h in hexes if mark.installed(self.home, h)}
        removed = sum(self._remove_partials(h) for h in hexes) + self._sweep_tmp()
        for record in self._glob(f"{mark.INSTALLS}/*"):
            removed += self._drop_stray_record(record.name)
        for lease in self._glob("leases/*"):
            removed += self._drop_stray_lease(lease.name)
        removed += fsutil.sweep_temporaries(self.home / "index", older_than_s=_INDEX_TMP_GRACE_S)
        return removed

    def tree_path(self, manifest: Manifest) -> Path:
        return self.home / "trees" / manifest.blob.hex

    def blob_path(self, digest: str) -> Path:
        return self.home / blob_relpath(digest)

    def scratch(self, name: str) -> Path:
        """A fresh private folder under tmp/ for a build or download in progress, owned by this
        process until the folder is removed; folders of owners that died go on the way."""
        self.claim()
        self._release_finished_scratches()
        self._sweep_tmp()
        lock = fsutil.Flock.acquire(self.home / "locks" / f"scratch-{name}.lock", wait=False)
        path = self.home / "tmp" / name
        if lock is None:
            raise StoreError(f"{path} is in use by another build; wait for it to finish")
        shutil.rmtree(path, ignore_errors=True)  # a crashed owner's leftover: we hold its lock now
        path.mkdir(parents=True)
        self._scratches[path] = lock
        return path

    # -- installing ------------------------------------------------------------------------

    def _unpack(
        self, manifest: Manifest, source: Registry, tree: Path, limits: UnpackLimits, deadline: float | None = None
    ) -> None:
        """The blob, streamed from `source` unless it is here already, unpacked into `tree`; then the
        file list it was verified against is recorded beside it."""
        blob = self.blob_path(manifest.blob.digest)
        self._check_room(manifest, blob_needed=not blob.exists())
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
        fsutil.write_bytes(self._files_record(manifest.blob.hex), manifest.files_digest().encode())

    def _check_existing(self, manifest: Manifest, tree: Path) -> None:
        """A tree already here counts for `manifest` only if it was verified against the same file list."""
        record = self._files_record(manifest.blob.hex)
        try:
            recorded = fsutil.read_bounded(record, 128).decode("ascii", "replace")
        except FileNotFoundError:  # unpacked by an older prebake, or killed before recording: check it whole
            problems = tree_problems(tree, manifest.files)
            if problems:
                raise BundleError(self._disagrees(manifest, tree, f"its files differ: {problems[:3]}")) from None
            fsutil.write_bytes(record, manifest.files_digest().encode())
            return
        if recorded != manifest.files_digest():
            raise BundleError(self._disagrees(manifest, tree, "its blob was verified against another file list"))

    @staticmethod
    def _disagrees(manifest: Manifest, tree: Path, why: str) -> str:
        return (
            f"{manifest.kind} {manifest.key_digest[:16]} names blob {manifest.blob.digest[:23]}, whose tree {tree} "
            f"does not match this manifest ({why}): the manifest disagrees with its blob, it is corrupt or "
            f"tampered; refusing it (run `prebake verify --deep` on the registry)"
        )

    def _check_room(self, manifest: Manifest, *, blob_needed: bool) -> None:
        """Refuse before downloading when the disk cannot hold what the manifest declares."""
        need = manifest.unpacked_bytes + 4096 * len(manifest.files) + (manifest.blob.size if blob_needed else 0)
        self.home.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.home).free
        if need > free:
            raise StoreError(
                f"{manifest.kind} {manifest.key_digest[:16]} needs {_mib(need)} (blob {_mib(manifest.blob.size)}, "
                f"files {_mib(manifest.unpacked_bytes)}) and {self.home} has {_mib(free)} free; free space, "
                f"run `prebake store gc --max-size`, or point {HOME_ENV} at a larger disk"
            )

    def _files_record(self, hexd: str) -> Path:
        return self.home / "trees" / f"{hexd}.files"

    def _install_lock(self, hexd: str) -> Path:
        return self.home / "locks" / f"{hexd}.lock"

    def _lease(self, hexd: str) -> Path:
        path = self.home / "leases" / hexd
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _touch(self, hexd: str) -> None:
        now = time.time_ns()  # the kernel's file clock ticks too coarsely to order quick successive uses
        try:
            os.utime(self.home / "leases" / hexd, ns=(now, now))
        except FileNotFoundError:  # evicted meanwhile; a lease file is made by install, never here
            pass

    def _remove_partials(self, hexd: str) -> int:
        """Remove leftovers of crashed installs of `hexd`, unless an install of it is running."""
        lock = fsutil.Flock.acquire(self._install_lock(hexd), wait=False)
        if lock is None:
            return 0
        with lock:
            return self._remove_partials_locked(hexd)

    def _remove_partials_locked(self, hexd: str) -> int:
        """Remove partial trees and downloads of `hexd`; the caller holds its install lock, so
        any there belong to an install that died."""
        leftovers = self._glob(
            f"trees/.{hexd}.*.partial", f"blobs/sha256/{hexd[:2]}/{fsutil.TMP_PREFIX}{hexd}.tar.zst.*"
        )
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        return len(leftovers)

    # -- evicting --------------------------------------------------------------------------

    def _inventory(self) -> tuple[list[StoreEntry], list[tuple[Path, str | None]]]:
        """Every bundle in blobs/ or trees/, least recently used first; and the index entries
        that name no tree (or are unreadable), with the blob they name."""
        naming: dict[str, list[Path]] = {}
        dangling: list[tuple[Path, str | None]] = []
        owned = {p.name for p in self._glob(f"{mark.INSTALLS}/*") if re.fullmatch(_HEX, p.name)}
        if not (self.home / mark.MARK).exists():  # a store of the release before the mark, read before adoption
            owned |= mark.adoptable(self.home)
        for path in self._glob("index/*/*.json"):
            if path.name.startswith(fsutil.TMP_PREFIX):
                continue
            hexd = _named_blob(path)
            if hexd is None or not (self.home / "trees" / hexd).is_dir():
                if hexd is None or hexd in owned:  # an entry naming a blob we never installed is not ours
                    dangling.append((path, hexd))
            else:
                naming.setdefault(hexd, []).append(path)
        trees = {p.name: p for p in self._glob("trees/*") if p.name in owned and p.is_dir()}
        blobs = {
            h: p for p in self._glob("blobs/sha256/*/*.tar.zst") if (h := p.name.removesuffix(".tar.zst")) in owned
        }
        entries = []
        for hexd in trees.keys() | blobs.keys():
            tree, blob = trees.get(hexd), blobs.get(hexd)
            size = (_tree_bytes(tree) if tree else 0) + (_file_bytes(blob) if blob else 0)
            size += _file_bytes(self._files_record(hexd))
            lease = _mtime_ns(self.home / "leases" / hexd)
            last = lease if lease is not None else max(_mtime_ns(p) or 0 for p in (tree, blob) if p is not None)
            entries.append(StoreEntry(hexd, size, last, tuple(naming.get(hexd, ()))))
        entries.sort(key=lambda e: (e.last_use_ns, e.hex))
        return entries, dangling

    def evict(self, entry: StoreEntry) -> bool:
        """Remove one bundle (index entries, tree, blob) unless it is being installed or is held; True if it went."""
        self.claim()
        if not mark.installed(self.home, entry.hex):  # not ours, whatever its layout
            return False
        install = fsutil.Flock.acquire(self._install_lock(entry.hex), wait=False)
        if install is None:
            return False
        trash = None
        try:
            lease = fsutil.Flock.acquire(self._lease(entry.hex), wait=False)
            if lease is None:
                return False
            try:
                for index in entry.index:  # readers miss from here on
                    if _named_blob(index) == entry.hex:  # not replaced by another build since the inventory
                        index.unlink(missing_ok=True)
                tree = self.home / "trees" / entry.hex
                if tree.is_dir():
                    trash = self.home / "tmp" / f"{_EVICTED}{entry.hex}-{time.time_ns()}"
                    trash.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(tree, trash)  # one rename: the tree is whole or gone, never half deleted
                fsutil.crash_point("evict")
                self._files_record(entry.hex).unlink(missing_ok=True)
                self.blob_path("sha256:" + entry.hex).unlink(missing_ok=True)
                shutil.rmtree(self.home / "side" / "sha256" / entry.hex[:2] / entry.hex, ignore_errors=True)
                (self.home / mark.INSTALLS / entry.hex).unlink(missing_ok=True)  # last: a crash before it retries
            finally:
                lease.release(unlink=True)
        finally:
            install.release(unlink=True)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        return True

    def _heal(self, damaged: Damaged) -> Damaged:
        """Move a damaged entry aside and evict its tree; a tree a live process holds stays until the
        next install of its blob replaces it. An install of the blob running now heals it itself."""
        try:
            self.claim()
        except mark.StoreHomeError:  # not ours to move or delete in: the miss stands, nothing changes
            return damaged
        lock = None
        if damaged.blob_hex is not None:
            lock = fsutil.Flock.acquire(self._install_lock(damaged.blob_hex), wait=False)
            if lock is None:
                return damaged
        try:
            if not isinstance(check_hit(self.home, damaged.kind, damaged.key_digest), Damaged):
                return damaged  # replaced by a whole one since it was read: nothing to move
            moved = quarantine(self.home, damaged.kind, damaged.key_digest)
            if (
                damaged.blob_hex is not None
                and mark.installed(self.home, damaged.blob_hex)
                and not self.held(damaged.blob_hex)
            ):
                self._discard_damaged_locked(damaged.blob_hex)
        finally:
            if lock is not None:
                lock.release()
        return replace(damaged, moved_to=moved)

    def _discard_damaged_locked(self, hexd: str) -> None:
        """A damaged tree goes (one rename into tmp/), with its blob and file-list record, so the next
        install streams the bundle again from the registry; the caller holds `hexd`'s install lock."""
        tree = self.home / "trees" / hexd
        trash = self.home / "tmp" / f"{_EVICTED}{hexd}-{time.time_ns()}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tree, trash)
        except FileNotFoundError:
            return
        self._files_record(hexd).unlink(missing_ok=True)
        self.blob_path("sha256:" + hexd).unlink(missing_ok=True)
        shutil.rmtree(trash, ignore_errors=True)

    def _drop_dangling(self, index: Path, hexd: str | None) -> int:
        """Remove an index entry that names no tree (a crashed gc's, of a blob this store installed);
        one that cannot be read is moved into quarantine/ for whoever investigates, never deleted."""
        if hexd is None:
            parsed = parse_index_relpath(index.relative_to(self.home).as_posix())
            return int(parsed is not None and quarantine(self.home, *parsed) is not None)
        lock = fsutil.Flock.acquire(self._install_lock(hexd), wait=False)
        if lock is None:  # being installed right now: its tree is on the way
            return 0
        with lock:
            if (self.home / "trees" / hexd).is_dir() or _named_blob(index) != hexd:
                return 0
            index.unlink(missing_ok=True)
        return 1

    # -- leftovers -------------------------------------------------------------------------

    def _sweep_tmp(self) -> int:
        tmp = self.home / "tmp"
        return sum(self._remove_scratch_leftover(p) for p in sorted(tmp.iterdir())) if tmp.is_dir() else 0

    def _remove_scratch_leftover(self, path: Path) -> int:
        if path.name.startswith(_EVICTED):  # a gc died before deleting it; no one else reads tmp/
            shutil.rmtree(path, ignore_errors=True)
            return 1
        lock_path = self.home / "locks" / f"scratch-{path.name}.lock"
        if not lock_path.exists():  # not a scratch folder this store made (`scratch` takes its lock first)
            return 0
        lock = fsutil.Flock.acquire(lock_path, wait=False)
        if lock is None:  # its owner is alive
            return 0
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        lock.release(unlink=True)
        return 1

    def _drop_stray_lease(self, hexd: str) -> int:
        """A lease whose tree is gone: made by a `use` that came too late, or left by a killed gc."""
        if (self.home / "trees" / hexd).is_dir() or not re.fullmatch(_HEX, hexd):
            return 0
        install = fsutil.Flock.acquire(self._install_lock(hexd), wait=False)
        if install is None:  # being installed: its lease is about to be used
            return 0
        with install:
            lease = fsutil.Flock.acquire(self.home / "leases" / hexd, wait=False)
            if lease is None:
                return 0
            gone = not (self.home / "trees" / hexd).is_dir()
            lease.release(unlink=gone)
        return int(gone)

    def _forget_if_nothing_landed_locked(self, hexd: str) -> None:
        """The installs/ record of a failed install whose tree and blob are both gone (install lock held)."""
        if not (self.home / "trees" / hexd).exists() and not self.blob_path("sha256:" + hexd).exists():
            (self.home / mark.INSTALLS / hexd).unlink(missing_ok=True)

    def _drop_stray_record(self, hexd: str) -> int:
        """An installs/ record whose tree and blob are both gone: left by a gc killed before its last step."""
        if not re.fullmatch(_HEX, hexd):
            return 0
        install = fsutil.Flock.acquire(self._install_lock(hexd), wait=False)
        if install is None:  # being installed: the record comes before the blob
            return 0
        with install:
            gone = not (self.home / "trees" / hexd).exists() and not self.blob_path("sha256:" + hexd).exists()
            self._forget_if_nothing_landed_locked(hexd)
        return int(gone)

    def _release_finished_scratches(self) -> None:
        for path in [p for p in self._scratches if not p.exists()]:
            self._scratches.pop(path).release(unlink=True)

    def _glob(self, *patterns: str) -> list[Path]:
        return [p for pattern in patterns for p in sorted(self.home.glob(pattern))]


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


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _leftover(name: str) -> re.Match[str] | None:
    return _PARTIAL_TREE.match(name) or _PARTIAL_BLOB.match(name)


def _refused(entries: list[StoreEntry], refuse: Refuses | None) -> list[str]:
    """The blobs (hex) whose every index entry the policy refuses; an unreadable entry counts as refused."""
    if refuse is None:
        return []
    out = []
    for entry in entries:
        if not entry.index:
            continue
        verdicts = []
        for index in entry.index:
            try:
                verdicts.append(refuse(Manifest.parse(fsutil.read_bounded(index, MAX_MANIFEST_BYTES), str(index))))
            except (OSError, BundleError) as exc:
                verdicts.append(str(exc))
        if all(v is not None for v in verdicts):
            out.append(entry.hex)
    return out


def _named_blob(index: Path) -> str | None:
    """The blob hex an index entry names, read without validating the whole manifest; None if unreadable."""
    try:
        digest = json.loads(fsutil.read_bounded(index, MAX_MANIFEST_BYTES))["blob"]["digest"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # BundleError is a ValueError
        return None
    hexd = str(digest).removeprefix("sha256:")
    return hexd if re.fullmatch(_HEX, hexd) else None


def _tree_bytes(tree: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(tree):
        for name in files:
            total += _file_bytes(Path(root, name))
    return total


def _file_bytes(path: Path) -> int:
    try:
        return path.lstat().st_size
    except FileNotFoundError:
        return 0


def _mtime_ns(path: Path | None) -> int | None:
    try:
        return path.stat().st_mtime_ns if path is not None else None
    except FileNotFoundError:
        return None
