"""A kernel-cache image that KServe's KernelCache and Red Hat's GKM mount, from a graphs bundle.

    image = build_image(cache_tree, manifest, scratch)   from an engine's cache tree and the (signed) manifest
    digest = push_image(image, "oci://HOST/REPO", "TAG")   with prebake's OCI client

Knows images, layers and annotations only; what the cache folder holds, the engine says in a
CacheTree (prebake.engine.vllm.cache_tree for vLLM). Reads that folder, writes under `scratch`,
pushes through the OCI client only. The layout is the GPU Kernel Cache Image Specification's
"compat" variant with MCV's metadata: one gzip layer (io.vllm.cache/, io.vllm.manifest/,
io.prebake.manifest/), the cache.vllm.image/* labels and KServe's compatibility factors
(docs/registries.md, "Mount with KServe or GKM"). The tar is deterministic.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError
from prebake.registry.oci.artifact import CONFIG_TYPE, MANIFEST_TYPE, Blob, _architecture, canonical, sha256

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CACHE_DIR = "io.vllm.cache"  # the layer's folders, as the spec names them
MANIFEST_DIR = "io.vllm.manifest"
PREBAKE_DIR = "io.prebake.manifest"
LABEL = "cache.vllm.image/"
FACTOR = "org.prebake.kernelcache.factor."
FOOTPRINT = "org.prebake.kernelcache.compatibility-footprint"
CACHE_PATH = "org.prebake.kernelcache.cache-path"  # the VLLM_CACHE_ROOT the image's paths name
RELOCATED = "org.prebake.kernelcache.relocated"  # files whose paths were rewritten for it (not as signed)
RANKS = "org.prebake.kernelcache.ranks"  # the tensor-parallel ranks whose compile cache the image holds: "0,1"


class KernelCacheError(BundleError):
    """A bundle that is no vLLM graphs bundle, or a cache tree MCV's layout cannot describe."""


@dataclass(frozen=True)
class KernelCacheImage:
    layer: Path  # the tar+gzip on disk
    layer_ref: Blob
    config: bytes
    config_ref: Blob
    manifest: bytes
    digest: str  # the image manifest's digest
    factors: dict[str, str]
    labels: dict[str, str]
    compatibility_footprint: str | None


class LayerFiles(Protocol):
    """Which files of a cache folder the layer leaves out or rewrites, said by the engine whose cache
    it is; `rewritten` counts the files the rewrite changed, `cache_path` is the root they now name."""

    cache_path: str
    rewritten: int

    def leaves_out(self, path: Path) -> bool: ...

    def rewrites(self, name: str) -> bool: ...

    def rewrite(self, rel: str, data: bytes) -> bytes: ...


@dataclass(frozen=True)
class CacheTree:
    """An engine's cache folder as a kernel-cache image takes it (prebake.engine.vllm.cache_tree
    describes vLLM's): the folder that becomes io.vllm.cache/, MCV's manifest entries, the cache
    formats, the summary's one target, KServe's compatibility factors, and the files' rewrites."""

    root: Path
    entries: tuple[dict[str, Any], ...]
    formats: frozenset[str]
    target: dict[str, object]
    factors: dict[str, str]
    files: LayerFiles


def build_image(
    tree: CacheTree,
    manifest: Manifest,
    scratch: Path,
    *,
    runtime_image: str | None = None,
    model_uri: str | None = None,
    ranks: tuple[int, ...] = (0,),
) -> KernelCacheImage:
    """The kernel-cache image of an engine's cache tree and the bundle's manifest (layer written under
    `scratch`); `ranks`: the ranks whose compile cache the caller checked the tree holds (a label)."""
    footprint = None
    if runtime_image and model_uri:
        footprint = compatibility_footprint(runtime_image, model_uri, tree.factors)
    scratch.mkdir(parents=True, exist_ok=True)
    layer = scratch / "layer.tar.gz"
    mcv = json.dumps({"vllm": list(tree.entries)}, indent=1, sort_keys=True).encode()
    diff_id, size = _write_layer(layer, tree, mcv, manifest.to_bytes())
    labels = _labels(tree, size, ranks, footprint)
    layer_ref = Blob(LAYER_TYPE, fsutil.file_digest(layer), layer.stat().st_size)
    config = canonical(
        {
            "architecture": _architecture(manifest),
            "os": "linux",
            "config": {"Labels": labels},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    )
    config_ref = Blob(CONFIG_TYPE, sha256(config), len(config))
    body = canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": config_ref.descriptor(),
            "layers": [layer_ref.descriptor()],
            "annotations": _annotations(tree, manifest, footprint),
        }
    )
    return KernelCacheImage(layer, layer_ref, config, config_ref, body, sha256(body), tree.factors, labels, footprint)


def _labels(tree: CacheTree, size: int, ranks: tuple[int, ...], footprint: str | None) -> dict[str, str]:
    """The image config's labels: the spec's cache.vllm.image/* summary, the ranks, KServe's factors."""
    labels = {
        LABEL + "entry-count": str(len(tree.entries)),
        LABEL + "cache-size-bytes": str(size),  # the bytes of io.vllm.cache/'s files in the layer
        LABEL + "format": ",".join(sorted(tree.formats)),
        LABEL + "summary": json.dumps({"targets": [tree.target]}, separators=(",", ":")),
        RANKS: ",".join(str(r) for r in ranks),
        **{FACTOR + k: v for k, v in tree.factors.items()},
    }
    return labels | ({FOOTPRINT: footprint} if footprint else {})


def _annotations(tree: CacheTree, manifest: Manifest, footprint: str | None) -> dict[str, str]:
    """The image manifest's annotations: the bundle it was made from, the factors, the relocation
    (read after the layer is written: it counts the files rewritten)."""
    annotations = {
        LABEL + "variant": "compat",
        "org.prebake.manifest.digest": sha256(manifest.to_bytes()),
        "org.prebake.blob": manifest.blob.digest,
        "org.prebake.key-digest": manifest.key_digest,
        "org.opencontainers.image.title": f"vLLM kernel cache {manifest.labels.get('model', '')} {manifest.key_digest[:12]}",
        **{FACTOR + k: v for k, v in tree.factors.items()},
        CACHE_PATH: tree.files.cache_path,
        RELOCATED: str(tree.files.rewritten),
    }
    return annotations | ({FOOTPRINT: footprint} if footprint else {})


def push_image(image: KernelCacheImage, address: str, tag: str, env: Mapping[str, str] | None = None) -> str:
    """Push the image to `address` (oci://HOST/REPO) under `tag`; the manifest digest the registry names."""
    from prebake.registry.oci import OCIRegistry

    registry = OCIRegistry(address, env=os.environ if env is None else env)
    try:
        registry.push_blob(image.layer_ref, image.layer)
        registry.push_bytes(image.config_ref, image.config)
        got = registry.put_manifest(tag, image.manifest)
    finally:
        registry.client.close()
    if got and got != image.digest:
        raise KernelCacheError(
            f"{address}:{tag} stored the manifest as {got}, not {image.digest}; the registry rewrote it"
        )
    return image.digest


def compatibility_footprint(runtime_image: str, model_uri: str, factors: Mapping[str, str]) -> str | None:
    """KServe's compatibility footprint (identity.Calculate of runtimeImage, modelURIHash and the
    factors); None for a floating image (no tag, or :latest), which KServe gives no footprint."""
    image = runtime_image.strip()
    last_slash, last_colon = image.rfind("/"), image.rfind(":")
    if "@sha256:" not in image and (last_colon <= last_slash or image[last_colon + 1 :] == "latest"):
        return None
    return _go_json_sha256({"runtimeImage": image, "modelURIHash": model_uri_hash(model_uri), **factors})


def model_uri_hash(uri: str) -> str:
    """KServe's identity.ModelURIHash: the URI without user info, query or fragment, hashed as a list."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    netloc = parts.netloc.rpartition("@")[2]
    return hash_strings([urlunsplit((parts.scheme, netloc, parts.path, "", ""))])


def hash_strings(values: list[str]) -> str:
    """KServe's identity.HashStrings: sha256 of Go's JSON encoding of a list of strings."""
    return _go_json_sha256(values)


class _Hashing(io.RawIOBase):
    """A write-through sink that hashes what passes: the uncompressed tar's diff_id."""

    def __init__(self, sink: gzip.GzipFile):
        self.sink, self.digest = sink, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.digest.update(data)
        self.sink.write(data)
        return len(data)


def _write_layer(out: Path, tree: CacheTree, mcv: bytes, prebake_manifest: bytes) -> tuple[str, int]:
    """Write the tar+gzip layer; the sha256 of the uncompressed tar (its diff_id) and the bytes of the
    cache's regular files in it."""
    with out.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz:
        hashing = _Hashing(gz)
        with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in (CACHE_DIR, MANIFEST_DIR, PREBAKE_DIR):
                tar.addfile(_info(name + "/", tarfile.DIRTYPE, 0o755))
            size = sum(_add_cache_entry(tar, tree, path) for path in sorted(tree.root.rglob("*")))
            for rel, data in (
                (f"{MANIFEST_DIR}/manifest.json", mcv),
                (f"{PREBAKE_DIR}/manifest.json", prebake_manifest),
            ):
                info = _info(rel, tarfile.REGTYPE, 0o644)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return "sha256:" + hashing.digest.hexdigest(), size


def _add_cache_entry(tar: tarfile.TarFile, tree: CacheTree, path: Path) -> int:
    """Add one path of the cache folder under io.vllm.cache/ (rewritten or left out as the engine
    says); the bytes of a regular file added, 0 for anything else."""
    rel = path.relative_to(tree.root).as_posix()
    name = f"{CACHE_DIR}/{rel}"
    if path.is_symlink():
        info = _info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = os.readlink(path)
        tar.addfile(info)
        return 0
    if path.is_dir():
        tar.addfile(_info(name + "/", tarfile.DIRTYPE, 0o755))
        return 0
    if tree.files.leaves_out(path):
        return 0
    info = _info(name, tarfile.REGTYPE, 0o755 if os.access(path, os.X_OK) else 0o644)
    if tree.files.rewrites(path.name):
        data = tree.files.rewrite(rel, path.read_bytes())
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        return info.size
    info.size = path.stat().st_size
    with path.open("rb") as f:
        tar.addfile(info, f)
    return info.size


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.rstrip("/"))
    info.type, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = kind, mode, 0, 0, 0, "", ""
    return info


def _go_json_sha256(value: object) -> str:
    """sha256 of Go's encoding/json output for a map[string]string or []string: keys sorted, no
    spaces, UTF-8 as is, and <, >, & and U+2028/9 escaped as Go escapes them."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
