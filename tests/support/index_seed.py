"""Registries with many index entries, seeded directly (no blobs): for lookup, listing and miss tests.

    manifests = synthetic_manifests(1000)            # distinct keys: model m0..m999, two torch versions
    seed_folder(root, manifests)                      # <root>/index/graphs/<digest>.json
    seed_s3(client, bucket, prefix, manifests)        # the same layout in a bucket, parallel PUTs

Lookups, listings and miss explanations read only index entries, so the blobs they name
need not exist; each entry lists `files` files, as a real graphs bundle lists its cache.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import BlobRef, FileEntry, Manifest
from prebake.artifacts.keys import Key
from prebake.artifacts.layout import index_relpath


def entry_key(i: int, kind: str = "graphs") -> Key:
    torch = "2.13.0+cpu" if i % 2 == 0 else "2.14.1+cpu"
    return Key.of(kind, {"model": {"name": f"m{i}", "config": "sha256-of-config"}, "software": {"torch": torch}})


def synthetic_manifests(count: int, *, kind: str = "graphs", files: int = 50) -> list[Manifest]:
    return [_manifest(entry_key(i, kind), i, files) for i in range(count)]


def seed_folder(root: Path, manifests: list[Manifest]) -> None:
    for m in manifests:
        fsutil.write_bytes(Path(root) / index_relpath(m.kind, m.key_digest), m.to_bytes())


def seed_s3(client, bucket: str, prefix: str, manifests: list[Manifest]) -> None:
    def put(m: Manifest) -> None:
        key = f"{prefix}/{index_relpath(m.kind, m.key_digest)}" if prefix else index_relpath(m.kind, m.key_digest)
        client.put_object(Bucket=bucket, Key=key, Body=m.to_bytes(), ContentType="application/json")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, manifests))


def _manifest(key: Key, i: int, files: int) -> Manifest:
    digest = lambda s: "sha256:" + hashlib.sha256(s.encode()).hexdigest()  # noqa: E731
    return Manifest(
        kind=key.kind,
        key={group: dict(factors) for group, factors in key.groups},
        key_digest=key.digest,
        labels={"model": f"m{i}", "platform": "cpu-x86_64", "precision": "fp32", "tp": "1"},
        blob=BlobRef(digest=digest(f"blob{i}"), size=1 << 20),
        files=tuple(
            FileEntry(path=f"fxgraph/{j:03x}/entry", size=4096, sha256=digest(f"{i}/{j}")) for j in range(files)
        ),
        created="2026-11-30T12:00:00+00:00",
        builder="tests.support.index_seed",
    )


def seed_oci(registry, manifests: list[Manifest], *, threads: int = 8) -> list[Manifest]:
    """Publish each manifest's entry into an OCI registry (registry.oci.OCIRegistry) the way a publish
    leaves it: a small blob of its own as the layer (the manifests are given that blob), the image
    config, the manifest, the tag. Returns the manifests as published."""
    from prebake.artifacts.bundle.manifest import BlobRef
    from prebake.registry.oci.artifact import build, tag_for

    def put(m: Manifest) -> Manifest:
        data = f"layer of {m.key_digest}".encode()
        m = m.model_copy(update={"blob": BlobRef(digest="sha256:" + hashlib.sha256(data).hexdigest(), size=len(data))})
        artifact = build(m, "sha256:" + hashlib.sha256(data).hexdigest())
        registry.push_bytes(artifact.layer, data)
        registry.push_bytes(artifact.config_ref, artifact.config)
        registry.put_manifest(tag_for(m.kind, m.key_digest), artifact.manifest)
        return m

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(put, manifests))
