"""Small files on an OCI registry, each a one-layer artifact under a tag of its own, as an object store.

    side/sha256/<aa>/<hex>/<name>  <->  <repo>:prebake-side.<hex>.<name>   beside a blob, created once
    meta/<name>                    <->  <repo>:prebake-meta.<name>         about the registry, replaced whole
    summary/<kind>.json            <->  <repo>:prebake-summary.<kind>      a listing summary

OCIFiles is the object-store port (prebake.artifacts.ports.objects) over those tags, so the shared
parts (registry/shared/parts.py) keep an OCI registry's side files and summaries as any store's.
Each is an image manifest whose config is the empty descriptor and whose one layer is the file.
A tag is last-writer-wins: create-only is a look before the write and a read-back after it (of two
racing creators, the one whose layer the tag names is told True). None parses as an entry's tag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES
from prebake.artifacts.errors import BundleError, PrebakeError
from prebake.artifacts.ports.errors import RegistryError
from prebake.artifacts.ports.objects import Stored
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES
from prebake.registry.oci.artifact import MANIFEST_TYPE, Blob, canonical, sha256, tag_for

SIDE_TYPE = "application/vnd.prebake.side.v1"
META_TYPE = "application/vnd.prebake.meta.v1"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
SUMMARY_TYPE = "application/vnd.prebake.summary.v1"
SUMMARY_LAYER_TYPE = "application/vnd.prebake.summary.v1+json"
SIDE_PREFIX = "prebake-side."
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,49}$")
_HEX = re.compile(r"^sha256:([0-9a-f]{64})$")
_SIDE_KEY = re.compile(r"^side/sha256/[0-9a-f]{2}/([0-9a-f]{64})/(.+)$")
_SIDE_TAG = re.compile(r"^prebake-side\.([0-9a-f]{64})\.(.+)$")


def side_tag(blob_digest: str, name: str) -> str:
    m = _HEX.match(blob_digest)
    if m is None or not _NAME.match(name):
        raise PrebakeError(
            f"side file {name!r} of {blob_digest[:23]}: names are letters, digits, '.', '_' and '-' "
            f"(at most 50), beside a sha256 blob digest"
        )
    return f"{SIDE_PREFIX}{m.group(1)}.{name}"


def meta_tag(name: str) -> str:
    if not _NAME.match(name):
        raise PrebakeError(f"registry file {name!r}: names are letters, digits, '.', '_' and '-' (at most 50)")
    return f"prebake-meta.{name}"


def summary_tag(kind: str) -> str:
    tag_for(kind, "0" * 64)  # the same rules for kinds
    return f"prebake-summary.{kind}"


def file_manifest(data: bytes, artifact_type: str, layer_type: str) -> tuple[Blob, Blob, bytes]:
    """(the empty config, the layer, the manifest) of a one-layer artifact holding `data`."""
    layer = Blob(layer_type, sha256(data), len(data))
    empty = Blob(EMPTY_TYPE, sha256(EMPTY), len(EMPTY))
    doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": artifact_type,
        "config": empty.descriptor(),
        "layers": [layer.descriptor()],
    }
    return empty, layer, canonical(doc)


def file_layer(body: bytes, layer_type: str, where: str) -> Blob:
    """The one layer of a one-layer artifact's manifest, of type `layer_type`; a BundleError otherwise."""
    try:
        layers = json.loads(body).get("layers") or []
        if len(layers) != 1 or layers[0].get("mediaType") != layer_type:
            raise BundleError(f"{where} is not a prebake file of type {layer_type}")
        return Blob(layer_type, str(layers[0]["digest"]), int(layers[0].get("size", -1)))
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise BundleError(f"{where} is not a readable prebake file ({exc})") from exc


def _tagged(key: str) -> tuple[str, str, str]:
    """(tag, artifact type, layer type) of a small file's key."""
    if m := _SIDE_KEY.match(key):
        return side_tag(f"sha256:{m.group(1)}", m.group(2)), SIDE_TYPE, f"{SIDE_TYPE}+octet-stream"
    if key.startswith("meta/"):
        return meta_tag(key.removeprefix("meta/")), META_TYPE, f"{META_TYPE}+octet-stream"
    if key.startswith("summary/") and key.endswith(".json"):
        return summary_tag(key.removeprefix("summary/").removesuffix(".json")), SUMMARY_TYPE, SUMMARY_LAYER_TYPE
    raise PrebakeError(f"{key!r} is not a small file an OCI registry keeps (side/, meta/ or summary/)")


def _keyed(tag: str) -> str | None:
    """The key of a small file's tag; None for any other tag."""
    if m := _SIDE_TAG.match(tag):
        return f"side/sha256/{m.group(1)[:2]}/{m.group(1)}/{m.group(2)}"
    if tag.startswith("prebake-meta."):
        return f"meta/{tag.removeprefix('prebake-meta.')}"
    if tag.startswith("prebake-summary."):
        return f"summary/{tag.removeprefix('prebake-summary.')}.json"
    return None


class Repository(Protocol):
    """What OCIFiles needs of a repository (OCIRegistry has it)."""

    url: str
    writable: bool

    def read_manifest(self, reference: str) -> tuple[bytes, str] | None: ...

    def read_small_blob(self, digest: str, where: str, *, limit: int = ...) -> bytes: ...

    def push_bytes(self, ref: Blob, data: bytes) -> None: ...

    def put_manifest(self, reference: str, body: bytes) -> str: ...

    def delete_manifest(self, digest: str) -> None: ...

    def tags(self) -> Iterator[str]: ...


class OCIFiles:
    """The object-store port over an OCI repository's small-file tags (tag: the manifest's digest)."""

    def __init__(self, registry: Repository):
        self.registry, self.url, self.writable = registry, registry.url, registry.writable

    def head(self, key: str) -> Stored | None:
        tag, _, layer_type = _tagged(key)
        got = self.registry.read_manifest(tag)
        return None if got is None else Stored(key, file_layer(got[0], layer_type, self._where(tag)).size, got[1])

    def get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        tag, _, layer_type = _tagged(key)
        got = self.registry.read_manifest(tag)
        if got is None:
            return None
        layer = file_layer(got[0], layer_type, self._where(tag))
        return self.registry.read_small_blob(layer.digest, self._where(tag), limit=limit), got[1]

    def read(self, key: str, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        got = self.get(key, MAX_MANIFEST_BYTES)
        if got is None:
            raise RegistryError(f"{self._where(_tagged(key)[0])} is gone")
        yield got[0][first : None if last is None else last + 1]

    def put(self, key: str, data: bytes | Path, *, create_only: bool = False) -> bool:
        tag, artifact_type, layer_type = _tagged(key)
        data = data if isinstance(data, bytes) else Path(data).read_bytes()
        limit = MAX_MANIFEST_BYTES if key.startswith("summary/") else MAX_SIDE_FILE_BYTES
        if len(data) > limit:
            raise RegistryError(f"{self._where(tag)}: {len(data)} bytes is more than a small file may hold")
        if create_only and self.registry.read_manifest(tag) is not None:
            return False
        empty, layer, manifest = file_manifest(data, artifact_type, layer_type)
        self.registry.push_bytes(empty, EMPTY)
        self.registry.push_bytes(layer, data)
        self.registry.put_manifest(tag, manifest)
        if not create_only:
            return True
        got = self.registry.read_manifest(tag)  # the read-back: whom the tag names won
        return got is not None and file_layer(got[0], layer_type, self._where(tag)).digest == layer.digest

    def delete(self, key: str) -> None:
        got = self.registry.read_manifest(_tagged(key)[0])
        if got is not None:
            self.registry.delete_manifest(got[1])

    def list(self, prefix: str) -> Iterator[Stored]:
        """Every small file under `prefix`, by name only (the tags API gives no size or version)."""
        keys = sorted(k for t in self.registry.tags() if (k := _keyed(t)) is not None and k.startswith(prefix))
        yield from (Stored(k, -1, "") for k in keys)

    def _where(self, tag: str) -> str:
        return f"{self.url}:{tag}"


__all__ = [
    "META_TYPE",
    "SIDE_PREFIX",
    "SIDE_TYPE",
    "SUMMARY_LAYER_TYPE",
    "SUMMARY_TYPE",
    "OCIFiles",
    "file_layer",
    "file_manifest",
    "meta_tag",
    "side_tag",
    "summary_tag",
]
