"""One object names every path of the store (huggingface_hub's LocalDownloadFilePaths): the tree,
blob, file-list record, lease and locks of a blob, by its hex digest. The tree is drawn in local.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES
from prebake.artifacts.layout import blob_relpath, index_relpath

HEX = "[0-9a-f]{64}"
EVICTED = ".evicted-"  # tmp/.evicted-<hex>-<ns>: a tree renamed out of trees/ on its way to deletion


@dataclass(frozen=True)
class StorePaths:
    """The paths under one store home."""

    home: Path

    def tree(self, hexd: str) -> Path:
        return self.home / "trees" / hexd

    def files_record(self, hexd: str) -> Path:
        """The digest of the file list a tree was verified against, beside the tree."""
        return self.home / "trees" / f"{hexd}.files"

    def blob(self, digest: str) -> Path:
        return self.home / blob_relpath(digest)

    def cache(self, hexd: str) -> Path:
        """A tree's writable cache: what an engine started from `prebake fetch`'s exports writes
        (the tree itself is read-only), seeded from the tree; deleted with the tree."""
        return self.home / "caches" / hexd

    def side(self, hexd: str) -> Path:
        return self.home / "side" / "sha256" / hexd[:2] / hexd

    def index(self, kind: str, key_digest: str) -> Path:
        return self.home / index_relpath(kind, key_digest)

    def lease(self, hexd: str) -> Path:
        return self.home / "leases" / hexd

    def install_lock(self, hexd: str) -> Path:
        return self.home / "locks" / f"{hexd}.lock"

    def gc_lock(self) -> Path:
        return self.home / "locks" / "gc.lock"

    def scratch_lock(self, name: str) -> Path:
        return self.home / "locks" / f"scratch-{name}.lock"

    @property
    def tmp(self) -> Path:
        return self.home / "tmp"

    def trash(self, hexd: str, now_ns: int) -> Path:
        return self.tmp / f"{EVICTED}{hexd}-{now_ns}"

    def glob(self, *patterns: str) -> list[Path]:
        return [p for pattern in patterns for p in sorted(self.home.glob(pattern))]


def named_blob(index: Path) -> str | None:
    """The blob hex an index entry names, read without validating the whole manifest; None if unreadable."""
    try:
        digest = json.loads(fsutil.read_bounded(index, MAX_MANIFEST_BYTES))["blob"]["digest"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # BundleError is a ValueError
        return None
    hexd = str(digest).removeprefix("sha256:")
    return hexd if re.fullmatch(HEX, hexd) else None


def is_hex(name: str) -> bool:
    return re.fullmatch(HEX, name) is not None
