"""What every registry backend shares: settling a publish race and copying a blob verified.

The protocols themselves (Registry, Maintainable, Published) are the core's port, in
artifacts.ports; they are named here too for the backends.

A backend answers four questions and nothing else. A miss is `None`, never an exception;
faults (down, refused, corrupt) raise RegistryError subclasses so callers can tell a miss
from an outage. Publishing writes the blob first and then creates the index entry only if
it is absent, so two bakers racing on one key cannot clobber each other.
"""

from __future__ import annotations

from pathlib import Path

from artifacts.errors import PublishConflict
from artifacts.manifest import Manifest
from artifacts.ports import Maintainable, Published, Registry


def settle(existing: Manifest, manifest: Manifest, where: str) -> Published:
    """The outcome of publishing `manifest` where `existing` already answers its key.

    The same bundle again is a no-op; a different build of the same key is refused, and the
    registry keeps the first one (a losing baker is told, and uses the published bundle).
    """
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


__all__ = ["Maintainable", "Published", "Registry", "copy_verified", "settle"]
