"""A prebake bundle as an OCI image a container runtime can also unpack (docs/registries.md's drawing).

    <repo>:<kind>-<key digest>   one image manifest per bundle, artifactType application/vnd.prebake.bundle.v1
      config     a minimal image config (os, architecture, rootfs.diff_ids), so runtimes unpack it
      layers[0]  the bundle blob itself, tar+zstd: same bytes, same sha256
      annotations  org.prebake.manifest (the signed manifest, exact bytes; over INLINE_LIMIT it rides
                 in the config's labels instead) and .digest, plus kind, key, labels and factors

Pure: builds and reads documents, touches no registry. The manifest is canonical JSON with no
timestamp, so the same bundle gives the same digest whoever pushes it. The tag stays within the
distribution spec's 128 characters and alphabet for kinds of up to 56, never `sha256-<hex>`.
Written by hand: no library builds these documents byte-for-byte deterministic.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.errors import BundleError, PrebakeError

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"
ARTIFACT_TYPE = "application/vnd.prebake.bundle.v1"
ANNOTATION = "org.prebake.manifest"
ANNOTATION_DIGEST = "org.prebake.manifest.digest"
INLINE_LIMIT = 1 << 20  # prebake manifests up to this size ride in the OCI manifest itself
MAX_OCI_MANIFEST_BYTES = 4 << 20  # distribution's own limit on a manifest body

_TAG = re.compile(r"^([A-Za-z0-9_]{1,56})-([0-9a-f]{64})$")
_KIND = re.compile(r"^[A-Za-z0-9_]{1,56}$")


def tag_for(kind: str, key_digest: str) -> str:
    """The tag naming the index entry of (kind, key digest)."""
    if not _KIND.match(kind) or kind == "sha256":
        raise PrebakeError(
            f"artifact kind {kind!r} cannot name an OCI tag: kinds on an OCI registry are plain ASCII "
            f"identifiers of at most 56 characters, other than 'sha256'"
        )
    if not re.fullmatch(r"[0-9a-f]{64}", key_digest):
        raise PrebakeError(f"key digest {key_digest!r} must be 64 lower-case hex digits (a sha256)")
    return f"{kind}-{key_digest}"


def parse_tag(tag: str) -> tuple[str, str] | None:
    """(kind, key digest) for an index entry's tag; None for any other tag."""
    m = _TAG.match(tag)
    if m is None or m.group(1) == "sha256":
        return None
    return m.group(1), m.group(2)


def canonical(document: Mapping[str, object]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Blob:
    """A descriptor's three facts (what a manifest names and an upload must deliver)."""

    media_type: str
    digest: str
    size: int

    def descriptor(self) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class Artifact:
    """The documents that publish one bundle: push the layer and `config`, then `manifest`."""

    manifest: bytes
    digest: str  # of `manifest`
    config: bytes
    config_ref: Blob
    layer: Blob


def image_config(diff_id: str, manifest: Manifest, embed: bytes | None = None) -> bytes:
    """A minimal, deterministic OCI image config: what a runtime needs to unpack the one layer
    (and, when it is too large for an annotation, the prebake manifest as a label)."""
    labels = {"org.prebake.kind": manifest.kind, "org.prebake.key-digest": manifest.key_digest}
    if embed is not None:
        labels[ANNOTATION] = embed.decode()
    return canonical(
        {
            "architecture": _architecture(manifest),
            "os": "linux",
            "config": {"Labels": labels},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    )


def build(manifest: Manifest, diff_id: str) -> Artifact:
    """The OCI documents for `manifest`, whose blob (uncompressed: `diff_id`) becomes the one layer."""
    raw = manifest.to_bytes()
    inline = len(raw) <= INLINE_LIMIT
    config = image_config(diff_id, manifest, None if inline else raw)
    config_ref = Blob(CONFIG_TYPE, sha256(config), len(config))
    layer = Blob(LAYER_TYPE, manifest.blob.digest, manifest.blob.size)
    annotations = annotations_for(manifest)
    annotations[ANNOTATION_DIGEST] = sha256(raw)
    if inline:
        annotations[ANNOTATION] = raw.decode()
    document: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": config_ref.descriptor(),
        "layers": [
            {**layer.descriptor(), "annotations": {"org.opencontainers.image.title": f"{manifest.kind}.tar.zst"}}
        ],
        "annotations": annotations,
    }
    body = canonical(document)
    return Artifact(body, sha256(body), config, config_ref, layer)


def annotations_for(manifest: Manifest) -> dict[str, str]:
    """Key factors and labels as annotations (strings, sorted by name when serialised)."""
    out = {
        "org.prebake.kind": manifest.kind,
        "org.prebake.key-digest": manifest.key_digest,
        "org.prebake.blob": manifest.blob.digest,
        "org.opencontainers.image.title": f"prebake {manifest.kind} {manifest.key_digest[:12]}",
    }
    for name, value in manifest.labels.items():
        out[f"org.prebake.label.{name}"] = str(value)
    for group, factors in manifest.key.items():
        for factor, value in factors.items():
            out[f"org.prebake.key.{group}.{factor}"] = str(value)
    if manifest.signatures:
        out["org.prebake.signers"] = ",".join(s.signer for s in manifest.signatures)
    return out


@dataclass(frozen=True)
class Entry:
    """An index entry as read back: the prebake manifest (or where to fetch it) and what it must match."""

    layer: Blob
    config: Blob
    manifest_digest: str  # sha256 of the prebake manifest bytes
    inline: bytes | None  # those bytes, when they rode in the annotation (else: in the config's labels)


def read(body: bytes, where: str) -> Entry:
    """Parse an index entry's OCI manifest; anything that is not a prebake bundle is a BundleError."""
    if len(body) > MAX_OCI_MANIFEST_BYTES:
        raise BundleError(f"{where} is over {MAX_OCI_MANIFEST_BYTES} bytes; no prebake entry is: refusing it")
    try:
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if doc.get("artifactType") != ARTIFACT_TYPE:
            raise ValueError(f"artifactType is {str(doc.get('artifactType'))[:80]!r}, not {ARTIFACT_TYPE}")
        layers = doc["layers"]
        if not isinstance(layers, list) or len(layers) != 1:
            raise ValueError("a prebake bundle has exactly one layer")
        layer = Blob(str(layers[0]["mediaType"]), str(layers[0]["digest"]), int(layers[0]["size"]))
        cfg = doc["config"]
        config = Blob(str(cfg["mediaType"]), str(cfg["digest"]), int(cfg["size"]))
        notes = doc.get("annotations") or {}
        if not isinstance(notes, dict):
            raise ValueError("annotations are not an object")
        digest = str(notes[ANNOTATION_DIGEST])
        inline = notes.get(ANNOTATION)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise BundleError(
            f"{where} is not a prebake bundle manifest ({str(exc)[:200]}); remove or republish it"
        ) from exc
    if layer.media_type != LAYER_TYPE:
        raise BundleError(f"{where}: its layer is {layer.media_type[:80]!r}, not {LAYER_TYPE}; republish it")
    raw = None
    if inline is not None:
        raw = str(inline).encode()
        if sha256(raw) != digest:
            raise BundleError(f"{where}: its inline prebake manifest does not hash to {digest[:23]}: refusing it")
    return Entry(layer, config, digest, raw)


def manifest_from_config(config: bytes, where: str) -> bytes:
    """The prebake manifest a large entry keeps in its image config's labels."""
    try:
        return str(json.loads(config)["config"]["Labels"][ANNOTATION]).encode()
    except (ValueError, TypeError, KeyError, RecursionError):
        raise BundleError(f"{where}: its image config holds no prebake manifest; remove or republish it") from None


def parse_manifest(raw: bytes, entry: Entry, kind: str, key_digest: str, where: str) -> Manifest:
    """The prebake manifest of an entry, held to the entry's layer and tag."""
    if len(raw) > MAX_MANIFEST_BYTES or sha256(raw) != entry.manifest_digest:
        raise BundleError(f"{where}: the prebake manifest does not hash to {entry.manifest_digest[:23]}: refusing it")
    manifest = Manifest.parse(raw, where)
    if (manifest.kind, manifest.key_digest) != (kind, key_digest):
        raise BundleError(
            f"{where} holds the manifest of {manifest.kind} {manifest.key_digest[:16]}, not of its tag; "
            f"run `prebake verify --quarantine`"
        )
    if (manifest.blob.digest, manifest.blob.size) != (entry.layer.digest, entry.layer.size):
        raise BundleError(f"{where}: its layer is not the blob its prebake manifest names: refusing it")
    return manifest


def _architecture(manifest: Manifest) -> str:
    """The platform a runtime matches: arm64 for a bundle baked for an Arm host, amd64 otherwise."""
    text = " ".join([*manifest.labels.values(), *(v for g in manifest.key.values() for v in g.values())]).lower()
    return "arm64" if ("aarch64" in text or "arm64" in text) else "amd64"


def diff_id(blob: Path) -> str:
    """The sha256 of the uncompressed tar: what an image config's rootfs.diff_ids lists."""
    import zstandard

    h = hashlib.sha256()
    try:
        with blob.open("rb") as f, zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True) as reader:
            while chunk := reader.read(4 << 20):
                h.update(chunk)
    except zstandard.ZstdError as exc:
        raise BundleError(f"{blob} is not a zstd-compressed bundle ({exc}); repack it before publishing") from exc
    return "sha256:" + h.hexdigest()
