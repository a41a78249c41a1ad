"""Real bundles for registry tests: a small tree packed with prebake.artifacts.bundle.payload.pack and its manifest."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.keys import Key


@dataclass(frozen=True)
class Bundle:
    manifest: Manifest
    blob: Path


def make_bundle(
    workdir: Path,
    *,
    kind: str = "graphs",
    model: str = "tiny-llama",
    build: str = "first",
    payload_bytes: int = 4096,
) -> Bundle:
    """A bundle answering key (kind, model); `build` changes the payload but not the key, so two
    builds of one key are two different bundles for the same index entry."""
    key = Key.of(kind, {"model": {"name": model, "config": "sha256-of-config"}, "software": {"torch": "2.13.0+cpu"}})
    name = f"{kind}-{model}-{build}-{payload_bytes}"
    tree = workdir / "trees" / name
    (tree / "fxgraph").mkdir(parents=True, exist_ok=True)
    (tree / "fxgraph" / "entry.txt").write_text(f"{kind} {model} {build}\n")
    (tree / "kernels.bin").write_bytes(_bytes(name.encode(), payload_bytes))
    blob = workdir / "blobs" / f"{name}.tar.zst"
    blob.parent.mkdir(parents=True, exist_ok=True)
    packed = pack(tree, blob, level=1)
    manifest = Manifest(
        kind=kind,
        key={group: dict(factors) for group, factors in key.groups},
        key_digest=key.digest,
        labels={"model": model},
        blob=packed.blob,
        files=packed.files,
        created="2026-11-29T12:00:00Z",
        builder=f"test-{build}",
    )
    return Bundle(manifest, blob)


def _bytes(seed: bytes, size: int) -> bytes:
    """Incompressible bytes, the same for the same seed, so a blob is about `size` bytes on the wire."""
    rng, chunk = random.Random(seed), 16 << 20  # randbytes takes at most 2**31 bits at a time
    return b"".join(rng.randbytes(min(chunk, size - i)) for i in range(0, size, chunk))


def tampered(tree: Path) -> Path:
    """`tree` with write bits back on every folder and file: what a hand (or a bad disk) that edits an
    installed tree has; the store installs trees read-only (artifacts/store/sealing.py)."""
    for folder, _, files in os.walk(tree):
        os.chmod(folder, 0o755)
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), 0o644)
    return tree
