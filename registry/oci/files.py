"""Small files on an OCI registry, each a one-layer artifact under a tag of its own: the listing
summaries, the files beside a blob (its provenance attestation: prebake.artifacts.ports.registry
SideFiles) and the files about the registry (its signed revocation list).

    <repo>:prebake-side.<blob hex>.<name>   a file beside one blob, created once
    <repo>:prebake-meta.<name>              a file about the registry, replaced whole
    <repo>:prebake-summary.<kind>           a listing summary (oci_maintain.py)

Each is an OCI image manifest whose config is the empty descriptor and whose one layer holds the
file; its artifactType says what it is. A tag is last-writer-wins, so "created once" is a look
before the write and a read-back after it: of two racing creators, the one whose layer the tag
names on read-back is told True, the other False (each side file is signed on its own, so either
one is a whole, verifiable file). None of these tags parses as an index entry's.
"""

from __future__ import annotations

import json
import re

from prebake.artifacts.errors import BundleError, PrebakeError
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES
from prebake.registry.oci.artifact import MANIFEST_TYPE, Blob, canonical, sha256
from prebake.registry.oci.parts import OCIParts

SIDE_TYPE = "application/vnd.prebake.side.v1"
META_TYPE = "application/vnd.prebake.meta.v1"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
_EMPTY = b"{}"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,49}$")
_HEX = re.compile(r"^sha256:([0-9a-f]{64})$")


class OCIFiles(OCIParts):
    """Mixed into OCIRegistry: small files as one-layer artifacts, and SideFiles on top of them."""

    def put_side(self, blob_digest: str, name: str, data: bytes) -> bool:
        tag = side_tag(blob_digest, name)
        if self.read_manifest(tag) is not None:
            return False
        layer = self.write_file(tag, data, SIDE_TYPE, f"{SIDE_TYPE}+octet-stream")
        return self._layer_of(tag) == layer.digest  # the read-back: who the tag names won

    def get_side(self, blob_digest: str, name: str) -> bytes | None:
        return self.read_file(side_tag(blob_digest, name), f"{SIDE_TYPE}+octet-stream")

    def put_meta(self, name: str, data: bytes) -> None:
        self.write_file(meta_tag(name), data, META_TYPE, f"{META_TYPE}+octet-stream")

    def get_meta(self, name: str) -> bytes | None:
        return self.read_file(meta_tag(name), f"{META_TYPE}+octet-stream")

    # -- one-layer artifacts ------------------------------------------------------------------------

    def write_file(self, tag: str, data: bytes, artifact_type: str, layer_type: str) -> Blob:
        """Push `data` as the one layer of an artifact and point `tag` at it; the layer's descriptor."""
        if len(data) > MAX_SIDE_FILE_BYTES:
            raise PrebakeError(f"{self.url}:{tag}: {len(data)} bytes is more than a small file may hold")
        layer = Blob(layer_type, sha256(data), len(data))
        empty = Blob(EMPTY_TYPE, sha256(_EMPTY), len(_EMPTY))
        self.push_bytes(empty, _EMPTY)
        self.push_bytes(layer, data)
        doc = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "artifactType": artifact_type,
            "config": empty.descriptor(),
            "layers": [layer.descriptor()],
        }
        self.put_manifest(tag, canonical(doc))
        return layer

    def read_file(self, tag: str, layer_type: str) -> bytes | None:
        """The one layer of the artifact `tag` names; None when there is no such tag."""
        where = f"{self.url}:{tag}"
        got = self.read_manifest(tag)
        if got is None:
            return None
        try:
            layers = json.loads(got[0]).get("layers") or []
            if len(layers) != 1 or layers[0].get("mediaType") != layer_type:
                raise BundleError(f"{where} is not a prebake file of type {layer_type}")
            return self.read_small_blob(str(layers[0]["digest"]), where)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise BundleError(f"{where} is not a readable prebake file ({exc})") from exc

    def _layer_of(self, tag: str) -> str | None:
        got = self.read_manifest(tag)
        if got is None:
            return None
        layers = json.loads(got[0]).get("layers") or [{}]
        return str(layers[0].get("digest"))


def side_tag(blob_digest: str, name: str) -> str:
    m = _HEX.match(blob_digest)
    if m is None or not _NAME.match(name):
        raise PrebakeError(
            f"side file {name!r} of {blob_digest[:23]}: names are letters, digits, '.', '_' and '-' "
            f"(at most 50), beside a sha256 blob digest"
        )
    return f"prebake-side.{m.group(1)}.{name}"


def meta_tag(name: str) -> str:
    if not _NAME.match(name):
        raise PrebakeError(f"registry file {name!r}: names are letters, digits, '.', '_' and '-' (at most 50)")
    return f"prebake-meta.{name}"
