"""Eviction: the bundles this store installed, least recently used first, removed until the store
fits its bound; held trees, bundles being installed and other owners' files are never touched.

    entries(paths)             every evictable bundle (StoreEntry), and index entries naming no tree
    gc(paths, max_bytes, ...)  recover, drop dangling entries, evict past the bound (GcReport)
    evict(paths, entry)        one bundle: index entries, then its tree in one rename, then the rest

The trust policy in force can refuse bundles; those go first, whatever the bound.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.fsutil import mib
from prebake.artifacts.store import leases, mark, recovery, sealing
from prebake.artifacts.store.paths import StorePaths, is_hex, named_blob

# The trust policy in force (prebake.artifacts.ports.registry.TrustCheck): why a manifest is refused, or None.
Refuses = Callable[[Manifest], "str | None"]


@dataclass(frozen=True)
class StoreEntry:
    """One evictable bundle: its blob and/or tree, their bytes, when it was last used, the index
    entries naming it."""

    hex: str
    bytes: int
    last_use_ns: int
    index: tuple[Path, ...] = field(default=())


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
    home: Path | None = None  # the store it ran on

    def to_json(self) -> dict[str, Any]:
        return {
            "store": str(self.home) if self.home else None,
            "dry_run": self.dry_run,
            "max_bytes": self.max_bytes,
            "before_bytes": self.before_bytes,
            "after_bytes": self.after_bytes,
            "evicted": ["sha256:" + h for h in self.evicted],
            "in_use": ["sha256:" + h for h in self.in_use],
            "recovered": self.recovered,
            "refused": ["sha256:" + h for h in self.refused],
        }

    def render(self) -> str:
        verb = "would be evicted (dry run)" if self.dry_run else "evicted"
        lines = [
            f"gc: {mib(self.before_bytes)} -> {mib(self.after_bytes)} (bound {mib(self.max_bytes)}): "
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


def gc(paths: StorePaths, max_bytes: int, keep: Collection[str], refuse: Refuses | None) -> GcReport:
    """Evict past `max_bytes`; the caller has claimed the home and holds the gc lock."""
    recovered = recovery.recover(paths)
    entries, dangling = _scan(paths)
    recovered += sum(recovery.drop_dangling(paths, path, hexd) for path, hexd in dangling)
    refused = _refused(entries, refuse)
    entries.sort(key=lambda e: e.hex not in refused)  # stable: refused first, then least recently used
    before = total = sum(e.bytes for e in entries)
    evicted, in_use = [], []
    for entry in entries:
        if total <= max_bytes and entry.hex not in refused:
            break
        if entry.hex in keep:
            continue
        if evict(paths, entry):
            evicted.append(entry.hex)
            total -= entry.bytes
        else:
            in_use.append(entry.hex)
    return GcReport(
        max_bytes, before, total, tuple(evicted), tuple(in_use), recovered, refused=tuple(refused), home=paths.home
    )


def gc_plan(paths: StorePaths, max_bytes: int, keep: Collection[str], refuse: Refuses | None) -> GcReport:
    """What `gc` would evict, removing nothing."""
    found = entries(paths)
    refused = _refused(found, refuse)
    found.sort(key=lambda e: e.hex not in refused)
    before = total = sum(e.bytes for e in found)
    evicted, in_use = [], []
    for entry in (e for e in found if e.hex not in keep):
        if total <= max_bytes and entry.hex not in refused:
            break
        if leases.held(paths, entry.hex):
            in_use.append(entry.hex)
        else:
            evicted.append(entry.hex)
            total -= entry.bytes
    return GcReport(
        max_bytes,
        before,
        total,
        tuple(evicted),
        tuple(in_use),
        0,
        dry_run=True,
        refused=tuple(refused),
        home=paths.home,
    )


def entries(paths: StorePaths) -> list[StoreEntry]:
    """Every bundle in blobs/ or trees/, least recently used first."""
    return _scan(paths)[0]


def evict(paths: StorePaths, entry: StoreEntry) -> bool:
    """Remove one bundle (index entries, tree, blob) unless it is being installed or is held; True if it went."""
    if not mark.installed(paths.home, entry.hex):  # not ours, whatever its layout
        return False
    install = fsutil.Flock.acquire(paths.install_lock(entry.hex), wait=False)
    if install is None:
        return False
    trash = None
    try:
        lease = fsutil.Flock.acquire(leases.lease_file(paths, entry.hex), wait=False)
        if lease is None:
            return False
        try:
            trash = _remove_locked(paths, entry)
        finally:
            lease.release(unlink=True)
    finally:
        install.release(unlink=True)
    if trash is not None:
        sealing.remove(trash)
    return True


def _remove_locked(paths: StorePaths, entry: StoreEntry) -> Path | None:
    """Remove `entry` (its install lock and lease held); the tree, renamed into tmp/, is returned to delete."""
    for index in entry.index:  # readers miss from here on
        if named_blob(index) == entry.hex:  # not replaced by another build since the inventory
            index.unlink(missing_ok=True)
    trash = None
    if paths.tree(entry.hex).is_dir():
        trash = paths.trash(entry.hex, time.time_ns())
        trash.parent.mkdir(parents=True, exist_ok=True)
        sealing.open_top(paths.tree(entry.hex))
        os.replace(paths.tree(entry.hex), trash)  # one rename: the tree is whole or gone, never half deleted
    fsutil.crash_point("evict")
    paths.files_record(entry.hex).unlink(missing_ok=True)
    paths.blob("sha256:" + entry.hex).unlink(missing_ok=True)
    shutil.rmtree(paths.side(entry.hex), ignore_errors=True)
    sealing.remove(paths.cache(entry.hex))  # what engines wrote beside the tree goes with it
    (paths.home / mark.INSTALLS / entry.hex).unlink(missing_ok=True)  # last: a crash before it retries
    return trash


def _scan(paths: StorePaths) -> tuple[list[StoreEntry], list[tuple[Path, str | None]]]:
    """Every bundle in blobs/ or trees/, least recently used first; and the index entries
    that name no tree (or are unreadable), with the blob they name."""
    owned = {p.name for p in paths.glob(f"{mark.INSTALLS}/*") if is_hex(p.name)}
    if not (paths.home / mark.MARK).exists():  # a store of the release before the mark, read before adoption
        owned |= mark.adoptable(paths.home)
    naming, dangling = _index_entries(paths, owned)
    trees = {p.name: p for p in paths.glob("trees/*") if p.name in owned and p.is_dir()}
    blobs = {h: p for p in paths.glob("blobs/sha256/*/*.tar.zst") if (h := p.name.removesuffix(".tar.zst")) in owned}
    entries = []
    for hexd in trees.keys() | blobs.keys():
        tree, blob = trees.get(hexd), blobs.get(hexd)
        size = (_tree_bytes(tree) if tree else 0) + (_file_bytes(blob) if blob else 0)
        size += _file_bytes(paths.files_record(hexd))
        lease = _mtime_ns(paths.lease(hexd))
        last = lease if lease is not None else max(_mtime_ns(p) or 0 for p in (tree, blob) if p is not None)
        entries.append(StoreEntry(hexd, size, last, tuple(naming.get(hexd, ()))))
    entries.sort(key=lambda e: (e.last_use_ns, e.hex))
    return entries, dangling


def _index_entries(paths: StorePaths, owned: set[str]) -> tuple[dict[str, list[Path]], list[tuple[Path, str | None]]]:
    """The index entries naming each tree here; and those naming none (or unreadable), of blobs we installed."""
    naming: dict[str, list[Path]] = {}
    dangling: list[tuple[Path, str | None]] = []
    for path in paths.glob("index/*/*.json"):
        if path.name.startswith(fsutil.TMP_PREFIX):
            continue
        hexd = named_blob(path)
        if hexd is None or not paths.tree(hexd).is_dir():
            if hexd is None or hexd in owned:  # an entry naming a blob we never installed is not ours
                dangling.append((path, hexd))
        else:
            naming.setdefault(hexd, []).append(path)
    return naming, dangling


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
