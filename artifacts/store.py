"""The local store: bundles fetched onto this machine, verified and unpacked, safe for many processes.

    $PREBAKE_HOME/                                 (default ~/.cache/prebake)
    ├── registry/                                  the embedded default registry (index/ + blobs/)
    ├── index/<kind>/<key-digest>.json             manifests of bundles installed here
    ├── blobs/sha256/<aa>/<digest>.tar.zst         their payloads, as downloaded and verified
    ├── trees/<blob-hex>/                          the unpacked payloads engines point at
    ├── locks/<blob-hex>.lock                      one install of a blob at a time
    └── tmp/                                       nothing here is ever read

A tree appears by rename only after its blob matched its digest and every file matched
the manifest, so a reader sees a whole tree or none. The index entry is written after the
tree, so an index entry always names a complete tree. Keep the store on local disk: file
locks do not work on NFS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from . import fsutil
from .bundle import UnpackLimits, unpack
from .errors import StoreError
from .layout import blob_relpath, index_relpath
from .manifest import Manifest

if TYPE_CHECKING:  # the store only needs something with fetch_blob; no import of registry/ at run time
    from registry.base import Registry

HOME_ENV = "PREBAKE_HOME"
REGISTRY_ENV = "PREBAKE_REGISTRY"


def default_home(env=os.environ) -> Path:
    return Path(env.get(HOME_ENV) or Path.home() / ".cache" / "prebake").expanduser()


@dataclass(frozen=True)
class Installed:
    """A bundle unpacked in the store: its manifest and the tree engines point at."""

    manifest: Manifest
    tree: Path


class Store:
    """One machine's store of verified, unpacked bundles."""

    def __init__(self, home: Path | str | None = None):
        self.home = Path(home).expanduser() if home else default_home()

    @property
    def default_registry(self) -> Path:
        return self.home / "registry"

    def registry_address(self, explicit: str | None = None, env=os.environ) -> str:
        """The registry to use: the explicit one, else $PREBAKE_REGISTRY, else the embedded folder."""
        return explicit or env.get(REGISTRY_ENV) or str(self.default_registry)

    def lookup(self, kind: str, key_digest: str) -> Installed | None:
        """The installed bundle for this key, if its tree is complete."""
        path = self.home / index_relpath(kind, key_digest)
        if not path.exists():
            return None
        manifest = Manifest.read(path)
        tree = self.tree_path(manifest)
        return Installed(manifest, tree) if tree.is_dir() else None

    def install(self, manifest: Manifest, source: "Registry", *, limits: UnpackLimits = UnpackLimits()) -> Installed:
        """Fetch, verify and unpack `manifest`'s blob from `source`, once per blob across processes."""
        tree = self.tree_path(manifest)
        (self.home / "locks").mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.home / "locks" / f"{manifest.blob.hex}.lock")):
            if not tree.is_dir():
                blob = self.blob_path(manifest.blob.digest)
                if not blob.exists():
                    source.fetch_blob(manifest.blob.digest, blob)
                try:
                    unpack(blob, tree, manifest.files, limits=limits)
                except Exception:
                    blob.unlink(missing_ok=True)  # a bad blob must not be trusted on the next try
                    raise
            fsutil.write_bytes(self.home / index_relpath(manifest.kind, manifest.key_digest), manifest.to_bytes())
        return Installed(manifest, tree)

    def tree_path(self, manifest: Manifest) -> Path:
        return self.home / "trees" / manifest.blob.hex

    def blob_path(self, digest: str) -> Path:
        return self.home / blob_relpath(digest)

    def scratch(self, name: str) -> Path:
        """A fresh private folder under tmp/ for a build or download in progress."""
        path = self.home / "tmp" / name
        try:
            path.mkdir(parents=True, exist_ok=False)
        except FileExistsError as exc:
            raise StoreError(f"{path} is in use by another build; wait for it or remove it if no build runs") from exc
        return path
