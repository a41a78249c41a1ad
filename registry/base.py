"""The registry protocol: where bundles live, the same index/ + blobs/ layout on every backend.

A backend answers four questions and nothing else. A miss is `None`, never an exception;
faults (down, refused, corrupt) raise RegistryError subclasses so callers can tell a miss
from an outage. Publishing writes the blob first and then creates the index entry only if
it is absent, so two bakers racing on one key cannot clobber each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from artifacts.manifest import Manifest


@dataclass(frozen=True)
class Published:
    """The outcome of a publish: created, or already there with the very same bundle."""

    manifest: Manifest
    created: bool
    where: str


def settle(existing: Manifest, manifest: Manifest, where: str) -> Published:
    """The outcome of publishing `manifest` where `existing` already answers its key.

    The same bundle again is a no-op; a different build of the same key is refused, and the
    registry keeps the first one (a losing baker is told, and uses the published bundle).
    """
    from .errors import PublishConflict

    if existing.same_bundle(manifest):
        return Published(existing, created=False, where=where)
    raise PublishConflict(
        f"{where} already names blob {existing.blob.digest[:23]}, a different build of the same key; "
        f"the registry keeps the first one (your bake is fine: use the published bundle)",
        existing_blob=existing.blob.digest,
    )


def copy_verified(src: Path, dest: Path, digest: str, *, where: str, registry_url: str) -> Path:
    """Copy a local blob to `dest` atomically, hashing as it goes; a wrong digest leaves no `dest`."""
    import hashlib

    from artifacts import fsutil

    from .errors import BlobDigestMismatch

    h = hashlib.sha256()
    with fsutil.atomic_target(dest) as tmp, src.open("rb") as fin, tmp.open("wb") as fout:
        while chunk := fin.read(1 << 20):
            h.update(chunk)
            fout.write(chunk)
        if "sha256:" + h.hexdigest() != digest:
            raise BlobDigestMismatch(
                f"blob {where} hashes to sha256:{h.hexdigest()}, not {digest}: it is corrupt; "
                f"run `prebake verify --quarantine --registry {registry_url}` and rebake"
            )
    return dest


@runtime_checkable
class Registry(Protocol):
    """Where bundles live. Every backend has the same layout: index/ and blobs/.

    `writable` is False for a registry that can only be read (an offline Hub, a Hub address
    pinned to a commit); chains skip such registries when they backfill.
    """

    url: str
    writable: bool

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        """The manifest that answers this key, or None."""

    def fetch_blob(self, digest: str, dest: Path) -> Path:
        """Download the blob named `digest` to `dest` (atomically), verify its sha256, return dest."""

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        """Store the blob, then create the index entry if absent. Raises PublishConflict if a
        different bundle already answers the key."""

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        """Every manifest in the index (of one kind, if given)."""
