"""What a store holds, as `prebake store ls` shows it: one row per blob (its tree, its blob file,
the index entries naming it, its size, its last use, whether a live engine holds it)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.errors import BundleError, PrebakeError
from prebake.artifacts.store.eviction import StoreEntry
from prebake.artifacts.store.health import other_schema
from prebake.artifacts.store.local import Store
from prebake.artifacts.tables import table


@dataclass(frozen=True)
class StoredBundle:
    """One bundle in the store: its blob (hex), the manifests naming it, and its state."""

    entry: StoreEntry
    manifests: tuple[Manifest, ...]
    unreadable: tuple[str, ...]  # index entries naming it that do not parse: why
    has_tree: bool
    has_blob: bool
    held: bool
    holders: tuple[int, ...]  # pids holding it, where the kernel says (Linux /proc/locks)

    @property
    def hex(self) -> str:
        return self.entry.hex

    def to_json(self) -> dict[str, Any]:
        return {
            "blob": "sha256:" + self.hex,
            "bytes": self.entry.bytes,
            "tree": self.has_tree,
            "blob_file": self.has_blob,
            "last_use": _iso_ns(self.entry.last_use_ns),
            "held": self.held,
            "holders": list(self.holders),
            "entries": [
                {
                    "kind": m.kind,
                    "key": m.key_digest,
                    "model": m.labels.get("model"),
                    "labels": dict(m.labels),
                    "created": m.created,
                    "build_seconds": m.build_seconds,
                }
                for m in self.manifests
            ],
            "unreadable_entries": list(self.unreadable),
        }

    def row(self) -> tuple[str, ...]:
        """Its row of `prebake store ls`: the first manifest naming it (+N more), its state."""
        first = self.manifests[0] if self.manifests else None
        more = f" +{len(self.manifests) - 1}" if len(self.manifests) > 1 else ""
        held = ("yes" + (f" (pid {','.join(map(str, self.holders))})" if self.holders else "")) if self.held else "no"
        last_use = _iso_ns(self.entry.last_use_ns) or "-"
        return (
            (first.labels.get("model") if first else None) or "?",
            (first.kind if first else "-") + more,
            (first.key_digest[:16] if first else "(no index entry)") + ("" if self.has_tree else " (no tree)"),
            self.hex[:12],
            fsutil.human_size(self.entry.bytes),
            last_use.replace("T", " ").removesuffix("Z"),
            held,
        )


def list_bundles(store: Store) -> tuple[StoredBundle, ...]:
    """Every bundle in the store, most recently used first."""
    store.check_readable()
    bundles = []
    for entry in reversed(store.entries()):
        manifests, unreadable = [], []
        for path in entry.index:
            raw = b""
            try:
                raw = fsutil.read_bounded(path, MAX_MANIFEST_BYTES)
                manifests.append(Manifest.parse(raw, str(path)))
            except (OSError, PrebakeError) as exc:
                if not (isinstance(exc, BundleError) and other_schema(raw)):  # another release's: not damage
                    unreadable.append(f"{path.relative_to(store.home)}: {exc}")
        held = store.held(entry.hex)
        bundles.append(
            StoredBundle(
                entry,
                tuple(manifests),
                tuple(unreadable),
                (store.home / "trees" / entry.hex).is_dir(),
                store.blob_path("sha256:" + entry.hex).is_file(),
                held,
                _holders(store.home / "leases" / entry.hex) if held else (),
            )
        )
    return tuple(bundles)


@dataclass(frozen=True)
class Inventory:
    """Every bundle of one store, most recently used first (`prebake store ls`)."""

    home: Path
    bundles: tuple[StoredBundle, ...]

    @property
    def total_bytes(self) -> int:
        return sum(b.entry.bytes for b in self.bundles)

    def to_json(self) -> dict[str, Any]:
        return {
            "store": str(self.home),
            "total_bytes": self.total_bytes,
            "bundles": [b.to_json() for b in self.bundles],
        }

    def render(self) -> str:
        """`prebake store ls`: a row per bundle, then the count and the bytes."""
        if not self.bundles:
            return f"no bundles installed in {self.home}"
        headers = ("MODEL", "KIND", "KEY", "BLOB", "SIZE", "LAST USE", "HELD")
        rows = [b.row() for b in self.bundles]
        total = f"{len(self.bundles)} bundle(s), {fsutil.human_size(self.total_bytes)} in {self.home}"
        return table(headers, rows) + "\n" + total


def inventory(store: Store) -> Inventory:
    """The store's inventory (list_bundles with the store it was read from)."""
    return Inventory(store.home, list_bundles(store))


def _holders(lease: Path) -> tuple[int, ...]:
    """Pids with a flock on `lease`, from /proc/locks (Linux); () where that cannot be read."""
    try:
        st = lease.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ()
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = set()
    for line in lines:
        fields = line.split()
        if (
            "->" not in fields
            and len(fields) >= 6
            and fields[1] == "FLOCK"
            and fields[5] == wanted
            and fields[4].isdigit()
        ):
            pids.add(int(fields[4]))
    return tuple(sorted(pids))


def _iso_ns(ns: int) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9)) if ns else None
