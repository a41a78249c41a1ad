"""Helpers for fleet tests and benchmarks: index entries written straight into a folder registry."""

from __future__ import annotations

import hashlib
from pathlib import Path

from prebake.artifacts.bundle.manifest import BlobRef, Manifest
from prebake.artifacts.keys import Key
from prebake.artifacts.layout import index_relpath


def write_entry(root: Path, key: Key, labels: dict[str, str] | None = None) -> Path:
    """An index entry answering `key` (its blob is not written: planning never reads blobs)."""
    manifest = Manifest(
        kind=key.kind,
        key={group: dict(factors) for group, factors in key.groups},
        key_digest=key.digest,
        labels=labels or {},
        blob=BlobRef(digest="sha256:" + hashlib.sha256(key.digest.encode()).hexdigest(), size=0),
        files=(),
        created="2026-11-30T12:00:00Z",
        builder="test",
    )
    path = root / index_relpath(key.kind, key.digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(manifest.to_bytes())
    return path


def fill_registry(root: Path, n: int, kind: str = "graphs") -> None:
    """n entries of unrelated keys, as other models' bundles would be."""
    for i in range(n):
        write_entry(root, Key.of(kind, {"model": {"name": f"other-{i}"}}))
