"""The operator's view of a store: whether it is whole, and removing bundles (what it holds: inventory.py).

`verify_store` re-hashes every tree file and blob against the manifest naming it and, with
`fix`, removes each broken bundle (index entries, tree, blob) so the next fetch installs it
again; a bundle held by a live engine is never removed, only reported. `select` and
`remove` back `prebake store rm`, `collect` `prebake store gc`. Every removal goes through
`Store.evict`, which takes the same locks as gc, so none of this races installs, engines or a
running gc; each refuses first a folder registry that shares the store's folder (overlap.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.payload import file_digest
from prebake.artifacts.bundle.unpack import tree_problems
from prebake.artifacts.errors import PrebakeError, StoreError
from prebake.artifacts.layout import parse_index_relpath
from prebake.artifacts.store.eviction import GcReport, Refuses
from prebake.artifacts.store.health import Damaged, check_hit, quarantine
from prebake.artifacts.store.inventory import StoredBundle, list_bundles
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.overlap import check_apart

_HEX_PREFIX = re.compile(r"^(?:sha256:)?([0-9a-f]{4,64})$")


# -- verify -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreFinding:
    """One broken bundle: what is wrong and what --fix did about it."""

    blob_hex: str | None  # None: an index entry too damaged to name its blob
    kinds: tuple[str, ...]
    keys: tuple[str, ...]
    problems: tuple[str, ...]
    action: str = ""  # "removed", or why it was kept; empty without --fix

    def to_json(self) -> dict[str, Any]:
        return {
            "blob": "sha256:" + self.blob_hex if self.blob_hex else None,
            "kinds": list(self.kinds),
            "keys": list(self.keys),
            "problems": list(self.problems),
            "action": self.action or None,
        }


@dataclass(frozen=True)
class StoreVerifyReport:
    store: str
    bundles: int
    findings: tuple[StoreFinding, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> int:
        return self.bundles - len(self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "bundles": self.bundles,
            "ok": self.ok,
            "bad": len(self.findings),
            "findings": [f.to_json() for f in self.findings],
            "notes": list(self.notes),
        }

    def render(self) -> str:
        lines = [f"verify store {self.store}: {self.bundles} bundle(s), {self.ok} ok, {len(self.findings)} bad"]
        for f in self.findings:
            what = ", ".join(f"{k} {d[:16]}" for k, d in zip(f.kinds, f.keys)) or "no index entry"
            lines.append(f"  BAD {f.blob_hex[:16] if f.blob_hex else 'index entry'} ({what}):")
            lines += [f"      {p}" for p in f.problems]
            if f.action:
                lines.append(f"      -> {f.action}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.findings and not any(f.action for f in self.findings):
            lines.append("  run prebake store verify --fix to remove them; the next fetch installs them again")
        return "\n".join(lines)


def verify_store(store: Store, *, fix: bool = False, registry: str | None = None) -> StoreVerifyReport:
    """Re-hash every tree and blob against its manifest; with `fix`, remove the broken bundles
    (refused first when `registry`, the address in force, shares the store's folder). Only bundles
    the store installed are looked at (prebake.artifacts.store.mark)."""
    if fix:
        _apart_from_registries(store, registry)
    store.claim() if fix else store.check_readable()
    bundles = list_bundles(store)
    findings, unindexed, treeless = [], 0, 0
    for bundle in bundles:
        try:
            problems = _problems(store, bundle)
        except FileNotFoundError:
            if (
                not (store.home / "trees" / bundle.hex).exists()
                and not store.blob_path("sha256:" + bundle.hex).exists()
            ):
                continue  # evicted or removed while we read it: nothing left to verify
            problems = ["a file vanished while it was being read; run verify again"]
        except OSError as exc:
            problems = [f"cannot be read: {exc}"]
        unindexed += not bundle.manifests and not bundle.unreadable
        treeless += bool(bundle.manifests) and not bundle.has_tree
        if problems:
            action = _fix(store, bundle) if fix else ""
            kinds = tuple(m.kind for m in bundle.manifests)
            keys = tuple(m.key_digest for m in bundle.manifests)
            findings.append(StoreFinding(bundle.hex, kinds, keys, tuple(problems), action))
    findings += _damaged_entries(store, {p for b in bundles for p in b.entry.index}, fix)
    notes = []
    if unindexed:
        notes.append(
            f"{unindexed} bundle(s) are named by no index entry (an install or gc was cut short); gc evicts them first"
        )
    if treeless:  # a miss, which readers handle (the next fetch installs the tree again): not damage
        notes.append(f"{treeless} index entr(y/ies) name no unpacked tree: lookups miss them until the next fetch")
    return StoreVerifyReport(str(store.home), len(bundles), tuple(findings), tuple(notes))


def _damaged_entries(store: Store, seen: set[Path], fix: bool) -> list[StoreFinding]:
    """Index entries no bundle accounts for because they do not name a blob (cut short, not JSON, not a
    manifest, filed under another key): one finding each; with `fix`, moved into quarantine/."""
    findings = []
    for path in sorted(store.home.glob("index/*/*.json")):
        parsed = parse_index_relpath(path.relative_to(store.home).as_posix())
        if path in seen or parsed is None or path.name.startswith(fsutil.TMP_PREFIX):
            continue
        kind, key = parsed
        checked = check_hit(store.home, kind, key)
        if not isinstance(checked, Damaged) or checked.blob_hex is not None:  # whole, gone, or a tree's problem
            continue
        action = ""
        if fix:
            moved = quarantine(store.home, kind, key)
            action = f"moved aside to {moved}; the next fetch installs it again" if moved else "gone meanwhile"
        findings.append(StoreFinding(None, (kind,), (key,), (f"index entry: {checked.problem}",), action))
    return findings


def _problems(store: Store, bundle: StoredBundle) -> list[str]:
    problems = [f"index entry {u}" for u in bundle.unreadable]
    blob = store.blob_path("sha256:" + bundle.hex)
    if bundle.has_blob:
        if file_digest(blob) != "sha256:" + bundle.hex:
            problems.append(f"blob {blob.relative_to(store.home)} does not hash to its name: it was damaged on disk")
        else:
            size = blob.stat().st_size
            problems += [
                f"blob is {size} bytes, {m.kind} {m.key_digest[:16]}'s manifest says {m.blob.size}"
                for m in bundle.manifests
                if m.blob.size != size
            ]
    if bundle.has_tree:
        tree = store.home / "trees" / bundle.hex
        for m in bundle.manifests[:1]:  # every manifest naming a blob lists the files of that blob
            problems += [f"tree: {p}" for p in tree_problems(tree, m.files)]
        record = _recorded_file_list(store, bundle.hex)
        problems += [
            f"tree was verified against another file list than {m.kind} {m.key_digest[:16]}'s"
            for m in bundle.manifests
            if record is not None and record != m.files_digest()
        ]
    return problems


def _recorded_file_list(store: Store, hexd: str) -> str | None:
    """The file-list digest the tree was verified against when it was installed (trees/<hex>.files)."""
    try:
        return fsutil.read_bounded(store.home / "trees" / f"{hexd}.files", 128).decode("ascii", "replace")
    except (FileNotFoundError, PrebakeError):
        return None


def _fix(store: Store, bundle: StoredBundle) -> str:
    if bundle.held:
        return f"kept: {_held_text(bundle)}; stop it, then run prebake store verify --fix again"
    if store.evict(bundle.entry):
        return "removed; the next fetch installs it again"
    return "kept: it is being installed or was taken into use just now; run prebake store verify --fix again"


# -- rm ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoveReport:
    removed: tuple[StoredBundle, ...]
    kept: tuple[tuple[StoredBundle, str], ...]  # (bundle, why it was kept)
    dry_run: bool = False

    @property
    def exit_code(self) -> int:
        return 1 if self.kept else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "removed": [b.to_json() for b in self.removed],
            "kept": [b.to_json() | {"reason": why} for b, why in self.kept],
            "freed_bytes": sum(b.entry.bytes for b in self.removed),
        }

    def render(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        freed = sum(b.entry.bytes for b in self.removed)
        lines = [f"{verb} {len(self.removed)} bundle(s), {freed / (1 << 20):.1f} MiB; kept {len(self.kept)}"]
        lines += [f"  {verb} {_describe(b)}" for b in self.removed]
        lines += [f"  KEPT {_describe(b)}: {why}" for b, why in self.kept]
        return "\n".join(lines)


def select(store: Store, selector: str, kind: str | None = None) -> tuple[StoredBundle, ...]:
    """The bundles `selector` names: every bundle of a model (its label), or the one bundle whose key
    or blob digest starts with a hex prefix (at least 4 digits). Raises StoreError when none or
    several (for a prefix) match."""
    bundles = [b for b in list_bundles(store) if kind is None or any(m.kind == kind for m in b.manifests)]
    by_model = [b for b in bundles if any(m.labels.get("model") == selector for m in b.manifests)]
    if by_model:
        return tuple(by_model)
    match = _HEX_PREFIX.match(selector.lower())
    if match is None and re.fullmatch(r"(?:sha256:)?[0-9a-f]{1,3}", selector.lower()):
        raise StoreError(f"{selector!r} is too short to name a bundle: give at least 4 hex digits of its key or blob")
    if match is None:
        raise StoreError(
            f"no bundle of model {selector!r} in the store {store.home}; give a model name or a key or blob "
            f"digest prefix (4+ hex digits), as prebake store ls shows them"
        )
    prefix = match[1]
    hits = [b for b in bundles if b.hex.startswith(prefix) or any(m.key_digest.startswith(prefix) for m in b.manifests)]
    if not hits:
        raise StoreError(
            f"no bundle in the store {store.home} has a key or blob digest starting {prefix}; see prebake store ls"
        )
    if len(hits) > 1:
        names = "; ".join(_describe(b) for b in hits)
        raise StoreError(f"{prefix} names {len(hits)} bundles ({names}); give more digits")
    return tuple(hits)


def remove(
    store: Store, bundles: Iterable[StoredBundle], *, registry: str | None = None, dry_run: bool = False
) -> RemoveReport:
    """Remove each bundle (index entries, tree, blob) unless a live engine holds it; refused first
    when `registry`, the address in force, shares the store's folder."""
    _apart_from_registries(store, registry)
    if not dry_run:
        store.claim()
    removed, kept = [], []
    for bundle in bundles:
        if store.held(bundle.hex):
            kept.append((bundle, f"{_held_text(bundle)}; stop it first (gc and rm never remove a tree in use)"))
        elif dry_run or store.evict(bundle.entry):
            removed.append(bundle)
        else:
            kept.append((bundle, "being installed or taken into use right now; try again"))
    return RemoveReport(tuple(removed), tuple(kept), dry_run)


# -- helpers ----------------------------------------------------------------------------------


def _describe(b: StoredBundle) -> str:
    names = ", ".join(f"{m.labels.get('model', '?')} {m.kind} {m.key_digest[:16]}" for m in b.manifests)
    return f"{b.hex[:12]} ({names or 'no index entry'})"


def _held_text(b: StoredBundle) -> str:
    pids = f" (pid {', '.join(map(str, b.holders))})" if b.holders else ""
    return f"held by a live engine{pids}"


def collect(
    store: Store, max_bytes: int, *, registry: str | None = None, dry_run: bool = False, refuse: Refuses | None = None
) -> GcReport:
    """`prebake store gc`: evict down to `max_bytes` (Store.gc, waiting for a running gc), refused
    first when `registry` (the address in force) shares the store's folder."""
    _apart_from_registries(store, registry)
    report = store.gc(max_bytes, dry_run=dry_run, refuse=refuse)
    assert report is not None  # gc waits for a running gc instead of returning None
    return report


def _apart_from_registries(store: Store, registry: str | None) -> None:
    """StoreOverlapError when `registry`, the address in force (the composition root decides it;
    None: the store's embedded one), is a folder that shares the store's: removing from the store
    would delete the registry's bundles."""
    check_apart(store.home, registry or str(store.default_registry), embedded=store.default_registry)
