"""The store's hit path check: an index entry is trusted only if it parses and names a whole tree.

    check_hit(home, kind, key)   Manifest and tree (healthy), Damaged (why), or None (not here)
    quarantine(home, entry)      moves a damaged index entry into quarantine/ (readers miss from then on)

Re-hashing every tree on every start would cost as much as installing it, so the hit path checks
cheaply (the entry is a regular file of at most MAX_MANIFEST_BYTES that parses as a manifest of
its kind and key; every listed file and link is there, of its type and size: one lstat each) and
`prebake store verify` checks every byte. A damaged entry is a value the caller moves aside
before installing again from the registry; messages name the store, where the fix is.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, SCHEMA_VERSION, Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.layout import index_relpath

QUARANTINE = "quarantine"  # <home>/quarantine/index/<kind>/<key>.json[.<ns>]: entries the hit path moved aside
_MAX_REPORTED = 3  # problems named in one message; the rest are counted


@dataclass(frozen=True)
class Damaged:
    """A store entry that failed the hit path's check, and where it was moved."""

    kind: str
    key_digest: str
    problem: str
    home: Path
    moved_to: Path | None = None
    blob_hex: str | None = None  # the blob its manifest names, when the entry parsed

    def describe(self) -> str:
        where = f"; moved aside to {self.moved_to}" if self.moved_to is not None else ""
        return (
            f"store {self.home}: its {self.kind} {self.key_digest[:16]} entry is damaged ({self.problem}){where}; "
            f"installing it again from the registry (see `prebake store verify`)"
        )


def check_hit(home: Path, kind: str, key_digest: str) -> tuple[Manifest, Path] | Damaged | None:
    """The store's entry for (kind, key) if it parses and its tree is whole by a cheap check."""
    path = home / index_relpath(kind, key_digest)
    try:
        raw = fsutil.read_bounded(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, BundleError) as exc:
        return Damaged(kind, key_digest, f"its index entry cannot be read: {_short(exc)}", home)
    try:
        manifest = Manifest.parse(raw, str(path))
    except BundleError as exc:
        if other_schema(raw):  # another release's entry: a miss for this one, never moved aside or healed
            return None
        return Damaged(kind, key_digest, f"its index entry {path.name} does not parse: {_short(exc)}", home)
    if (manifest.kind, manifest.key_digest) != (kind, key_digest):
        return Damaged(
            kind, key_digest, f"its index entry holds {manifest.kind} {manifest.key_digest[:16]}", home, None
        )
    tree = home / "trees" / manifest.blob.hex
    if not tree.is_dir():  # evicted after its entry was read, or its entry outlived a crashed gc: a miss
        return None
    problem = tree_damage(tree, manifest)
    if problem is not None:
        return Damaged(kind, key_digest, problem, home, None, manifest.blob.hex)
    return manifest, tree


def tree_damage(tree: Path, manifest: Manifest) -> str | None:
    """What is missing or of the wrong type or size in `tree`, by one lstat per listed file; None if whole."""
    problems: list[str] = []
    for entry in manifest.files:
        path = tree / entry.path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            problems.append(f"{entry.path} is missing")
            continue
        except OSError as exc:
            problems.append(f"{entry.path} cannot be read: {exc.strerror or exc}")
            continue
        if entry.link is not None:
            if not stat.S_ISLNK(st.st_mode):
                problems.append(f"{entry.path} is no longer a link")
        elif not stat.S_ISREG(st.st_mode):
            problems.append(f"{entry.path} is no longer a regular file")
        elif st.st_size != entry.size:
            problems.append(f"{entry.path} is {st.st_size} bytes, the manifest says {entry.size}")
    if not problems:
        return None
    more = f" and {len(problems) - _MAX_REPORTED} more" if len(problems) > _MAX_REPORTED else ""
    return f"its tree {tree}: " + "; ".join(problems[:_MAX_REPORTED]) + more


def quarantine(home: Path, kind: str, key_digest: str) -> Path | None:
    """Move (kind, key)'s index entry under quarantine/; its new path, or None if it is gone already."""
    src = home / index_relpath(kind, key_digest)
    dest = home / QUARANTINE / index_relpath(kind, key_digest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():  # quarantined before: keep both for whoever investigates
        dest = dest.with_name(f"{dest.name}.{time.time_ns()}")
    try:
        os.replace(src, dest)
    except FileNotFoundError:  # another process moved it, or an install replaced it meanwhile
        return None
    fsutil.fsync_dir(src.parent)
    return dest


def _short(exc: BaseException, limit: int = 300) -> str:
    """The error without the registry's fix ("republish the bundle"): a store entry's fix is a fetch."""
    text = _REGISTRY_FIX.sub("", str(exc))
    return text if len(text) <= limit else text[:limit] + "…"


_REGISTRY_FIX = re.compile(r"; (republish|rebake|remove it|upgrade prebake or rebake)[^;]*$")


def other_schema(raw: bytes) -> bool:
    """True when the entry is a manifest object naming a schema other than the one this prebake reads."""
    try:
        schema = json.loads(raw).get("schema_version")
    except (ValueError, AttributeError, RecursionError):
        return False
    return schema is not None and schema != SCHEMA_VERSION
