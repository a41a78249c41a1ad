"""An OCI image layout as a registry: bundles on a disk, for sites with no registry at all.

    oci-layout:DIR        DIR/oci-layout, DIR/index.json (one descriptor per tag), DIR/blobs/sha256/<hex>
    oci-layout:FILE.tar   a tar of one (what `skopeo copy ... oci-archive:` and `tar` carry)

May touch that folder or tar, and a private scratch folder. The images are those an OCI registry
holds (registry/oci/artifact.py, files.py), so skopeo and umoci read what prebake writes. Not on
the object-store port: a layout holds images and an image index other tools read, not the registry's
key layout. Writes are create-only and crash-safe: blobs first, each renamed into place, index.json
last under a lock; a tar is filled as FILE.tar.partial/ (a rerun resumes it) and written whole once.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.ports.errors import RegistryError, RegistryNotFound, RegistryReadOnly
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES, Published
from prebake.registry.oci.artifact import (
    MANIFEST_TYPE,
    MAX_OCI_MANIFEST_BYTES,
    Blob,
    build,
    diff_id,
    manifest_from_config,
    parse_manifest,
    parse_tag,
    sha256,
    tag_for,
)
from prebake.registry.oci.artifact import read as read_entry
from prebake.registry.oci.files import EMPTY, META_TYPE, SIDE_TYPE, file_layer, file_manifest, meta_tag, side_tag
from prebake.registry.shared.parts import published_already
from prebake.registry.shared.transfer import copy_verified, missing, settle

SCHEME = "oci-layout:"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
LAYOUT_FILE = '{"imageLayoutVersion":"1.0.0"}'
Descriptors = list[dict[str, Any]]  # index.json's manifests (a module name: the class has a `list` method)


class LayoutRegistry:
    """Bundles in an OCI image layout (a directory, or a tar of one): Registry and SideFiles."""

    def __init__(self, address: str, *, create: bool = False):
        text = address[len(SCHEME) :] if address.startswith(SCHEME) else address
        if not text:
            raise RegistryError(f"{address!r} names no folder; write oci-layout:DIR or oci-layout:FILE.tar")
        path = Path(text).expanduser().absolute()
        self.url = f"{SCHEME}{path}"
        self.tar = path if path.suffix == ".tar" else None
        self.writable = create or self.tar is None  # a tar opened to read is unpacked in a scratch folder
        self.partial = None if self.tar is None else path.with_name(path.name + ".partial")
        if self.tar is None:
            self.root = path
            if create:
                _start_layout(path)
        elif create and self.partial is not None and self.partial.exists():
            self.root = self.partial  # a killed copy's: it holds what the tar holds and more; the rerun resumes
        elif self.tar.exists():
            self.root = _scratch()  # read from a private copy; the tar's folder is made on the first write
            _untar(self.tar, self.root)
        elif create:
            self.root = _scratch()
            _start_layout(self.root)
        else:
            raise RegistryNotFound(self._not_found())
        if not (self.root / "oci-layout").is_file():
            raise RegistryNotFound(self._not_found())

    def __repr__(self) -> str:
        return f"LayoutRegistry({self.url!r})"

    # -- Registry ----------------------------------------------------------------------------

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        tag = tag_for(kind, key_digest)
        body = self._manifest(tag)
        if body is None:
            return None
        where = f"{self.url}:{tag}"
        entry = read_entry(body, where)
        raw = entry.inline
        if raw is None:
            raw = manifest_from_config(self._small_blob(entry.config.digest, MAX_MANIFEST_BYTES, where), where)
        return parse_manifest(raw, entry, kind, key_digest, where)

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        where = f"{self.url}@{digest}"
        try:
            return copy_verified(
                self._blob_path(digest), Path(dest), digest, where=where, registry_url=self.url, size=size, tee=tee
            )
        except FileNotFoundError:
            raise missing(digest, where, self.url) from None

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        blob, tag = Path(blob), tag_for(manifest.kind, manifest.key_digest)
        where, read_only = f"{self.url}:{tag}", f"{self.url} was opened to read; `prebake copy` writes an OCI layout"
        if (settled := published_already(self, manifest, blob, where, read_only)) is not None:
            return settled
        self._writing()
        artifact = build(manifest, diff_id(blob))
        self._put_blob(artifact.layer.digest, blob)  # blobs first, the index.json naming them last
        self._put_blob(artifact.config_ref.digest, artifact.config)
        self._put_blob(artifact.digest, artifact.manifest)
        if self._tag(tag, Blob(MANIFEST_TYPE, artifact.digest, len(artifact.manifest)), create_only=True):
            return Published(manifest, created=True, where=where)
        theirs = self.lookup(manifest.kind, manifest.key_digest)
        assert theirs is not None, where
        return settle(theirs, manifest, where)

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        for tag in sorted(self.tags()):
            parsed = parse_tag(tag)
            if parsed is not None and (kind is None or parsed[0] == kind):
                found = self.lookup(*parsed)
                if found is not None:
                    yield found

    # -- SideFiles (registry/oci/files.py's tags) ----------------------------------------------

    def put_side(self, blob_digest: str, name: str, data: bytes) -> bool:
        return self._write_file(side_tag(blob_digest, name), data, SIDE_TYPE, create_only=True)

    def get_side(self, blob_digest: str, name: str) -> bytes | None:
        return self._read_file(side_tag(blob_digest, name), SIDE_TYPE)

    def put_meta(self, name: str, data: bytes) -> None:
        self._write_file(meta_tag(name), data, META_TYPE, create_only=False)

    def get_meta(self, name: str) -> bytes | None:
        return self._read_file(meta_tag(name), META_TYPE)

    # -- the tar ---------------------------------------------------------------------------------

    def finish(self) -> None:
        """For oci-layout:FILE.tar opened to write: write the tar whole (atomically), drop the folder
        (prebake.artifacts.ports.registry.Buffered)."""
        if self.tar is None or self.root != self.partial:
            return  # a folder layout, or a tar nothing was written to
        with fsutil.atomic_target(self.tar) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
            for name in ("oci-layout", "index.json", "blobs"):
                out.add(self.root / name, arcname=name, filter=_no_leftovers)
        shutil.rmtree(self.root)

    def _writing(self) -> None:
        """Before the first write into a tar: its folder, FILE.tar.partial/, from what was read."""
        if self.partial is not None and self.root != self.partial:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(self.root, self.partial)
            self.root = self.partial

    # -- the layout ------------------------------------------------------------------------------

    def tags(self) -> Iterator[str]:
        return (str(d["annotations"][REF_NAME]) for d in self._descriptors() if REF_NAME in d.get("annotations", {}))

    def _descriptors(self) -> Descriptors:
        path = self.root / "index.json"
        try:
            doc = json.loads(fsutil.read_bounded(path, MAX_OCI_MANIFEST_BYTES * 16))
            manifests = doc["manifests"]
            if not isinstance(manifests, list):
                raise TypeError("manifests is not a list")
            return [d for d in manifests if isinstance(d, dict)]
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as exc:
            raise BundleError(f"{path} is not an OCI image index ({exc}); is {self.url} an OCI image layout?") from exc

    def _write_index(self, descriptors: Descriptors) -> None:
        doc = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": descriptors}
        fsutil.write_bytes(self.root / "index.json", json.dumps(doc, indent=1).encode())

    def _tag(self, tag: str, ref: Blob, *, create_only: bool) -> bool:
        """Point `tag` at the manifest `ref` in index.json; create_only: False when the tag is taken."""
        with self._locked():
            kept: Descriptors = []
            for d in self._descriptors():
                if d.get("annotations", {}).get(REF_NAME) == tag:
                    if create_only:
                        return False
                    continue
                kept.append(d)
            self._write_index([*kept, {**ref.descriptor(), "annotations": {REF_NAME: tag}}])
        return True

    def _manifest(self, tag: str) -> bytes | None:
        for d in self._descriptors():
            if d.get("annotations", {}).get(REF_NAME) == tag:
                return self._small_blob(str(d["digest"]), MAX_OCI_MANIFEST_BYTES, f"{self.url}:{tag}")
        return None

    def _write_file(self, tag: str, data: bytes, artifact_type: str, *, create_only: bool) -> bool:
        if not self.writable:
            raise RegistryReadOnly(f"{self.url} was opened to read; `prebake copy` writes an OCI layout")
        if len(data) > MAX_SIDE_FILE_BYTES:
            raise RegistryError(f"{self.url}:{tag}: {len(data)} bytes is more than a small file may hold")
        if create_only and self._manifest(tag) is not None:
            return False
        self._writing()
        empty, layer, doc = file_manifest(data, artifact_type, f"{artifact_type}+octet-stream")
        self._put_blob(empty.digest, EMPTY)
        self._put_blob(layer.digest, data)
        self._put_blob(sha256(doc), doc)
        return self._tag(tag, Blob(MANIFEST_TYPE, sha256(doc), len(doc)), create_only=create_only)

    def _read_file(self, tag: str, artifact_type: str) -> bytes | None:
        where = f"{self.url}:{tag}"
        body = self._manifest(tag)
        if body is None:
            return None
        layer = file_layer(body, f"{artifact_type}+octet-stream", where)
        return self._small_blob(layer.digest, MAX_SIDE_FILE_BYTES, where)

    def _blob_path(self, digest: str) -> Path:
        algorithm, _, hex_ = digest.partition(":")
        if algorithm != "sha256" or len(hex_) != 64 or not all(c in "0123456789abcdef" for c in hex_):
            raise BundleError(f"{self.url}: {digest[:80]!r} is not a sha256 digest")
        return self.root / "blobs" / "sha256" / hex_

    def _small_blob(self, digest: str, limit: int, where: str) -> bytes:
        try:
            data = fsutil.read_bounded(self._blob_path(digest), limit)
        except FileNotFoundError:
            raise RegistryError(f"{where} names blob {digest[:23]}, which is missing from the layout") from None
        if sha256(data) != digest:
            raise BundleError(f"{where}: blob {digest[:23]} does not hash to its name: refusing it")
        return data

    def _put_blob(self, digest: str, data: bytes | Path) -> None:
        """Write a blob once, whole (renamed into place); one already there with its name is kept."""
        path = self._blob_path(digest)
        if path.exists():
            return
        if isinstance(data, Path):
            with fsutil.atomic_target(path) as tmp:
                shutil.copyfile(data, tmp)
        else:
            fsutil.write_bytes(path, data)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.root / "oci-layout").open("rb") as f:  # never replaced, unlike index.json
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _not_found(self) -> str:
        return (
            f"registry {self.url} is not an OCI image layout (no oci-layout file); name a folder or .tar that "
            f"`prebake copy` or `skopeo copy ... oci:DIR` wrote"
        )


def _start_layout(root: Path) -> None:
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    if not (root / "oci-layout").exists():
        fsutil.write_bytes(root / "oci-layout", LAYOUT_FILE.encode())
    if not (root / "index.json").exists():
        doc = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": []}
        fsutil.write_bytes(root / "index.json", json.dumps(doc).encode())


def _scratch() -> Path:
    path = Path(tempfile.mkdtemp(prefix="prebake-oci-layout-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _no_leftovers(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Leave out the half-written files a killed run left (fsutil's temporary names)."""
    return None if Path(member.name).name.startswith(fsutil.TMP_PREFIX) else member


def _untar(tar: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tar) as archive:
            archive.extractall(dest, filter="data")  # no links out, no devices, no absolute paths
    except (tarfile.TarError, OSError) as exc:
        raise RegistryError(f"cannot read {tar} as a tar of an OCI image layout: {exc}") from exc


__all__ = ["SCHEME", "LayoutRegistry"]
