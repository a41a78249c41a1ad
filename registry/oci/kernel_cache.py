"""A vLLM graphs bundle as a kernel-cache image that KServe's KernelCache and Red Hat's GKM mount.

    image = build_image(tree, manifest, scratch)     from an installed graphs tree and its (signed) manifest
    digest = push_image(image, "oci://HOST/REPO", "TAG")   with prebake's OCI client

May read the installed tree and write the image's files under `scratch`; pushes through the OCI
client only. The layout is the GPU Kernel Cache Image Specification's "compat" variant with MCV's
vLLM metadata: one gzip layer (io.vllm.cache/, io.vllm.manifest/, io.prebake.manifest/), the
cache.vllm.image/* labels, and KServe's compatibility factors from the bundle's key, normalized
KServe's way. docs/registries.md ("Mount with KServe or GKM") has the field-by-field table and the
pinned spec revisions. The tar is deterministic: the same bundle gives the same digests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import posixpath
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError
from prebake.registry.oci.artifact import CONFIG_TYPE, MANIFEST_TYPE, Blob, _architecture, canonical, sha256

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CACHE_DIR = "io.vllm.cache"
MANIFEST_DIR = "io.vllm.manifest"
PREBAKE_DIR = "io.prebake.manifest"
LABEL = "cache.vllm.image/"
FACTOR = "org.prebake.kernelcache.factor."
FOOTPRINT = "org.prebake.kernelcache.compatibility-footprint"
CACHE_PATH = "org.prebake.kernelcache.cache-path"  # the VLLM_CACHE_ROOT the image's paths name
RELOCATED = "org.prebake.kernelcache.relocated"  # files whose paths were rewritten for it (not as signed)
RANKS = "org.prebake.kernelcache.ranks"  # the tensor-parallel ranks whose compile cache the image holds: "0,1"
DEFAULT_CACHE_PATH = "/root/.cache/vllm"  # where KServe puts the cache when the container sets no VLLM_CACHE_ROOT
REPORT_FILE = "vllm.json"  # the graphs tree's bake report (prebake.engine.vllm.process.REPORT_FILE)
HANDLES_FILE = "vllm_compile_cache.py"  # prebake.engine.vllm.portability.HANDLES_FILE
GROUP_PREFIX = "__grp__"  # Triton's group files (prebake.engine.vllm.portability.GROUP_PREFIX)
TREE_CACHE = "vllm-cache"  # the graphs tree's VLLM_CACHE_ROOT (prebake.engine.vllm.process.CACHE_DIR)
INDUCTOR_DIR = "inductor_cache"  # Inductor's own cache in the root, where vLLM runs AOT compile off (CPU)
_DTYPES = {"fp32": ("float32", None), "bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "fp8")}
_AUTOTUNE_CONFIG = json.dumps({"inductor_compile_config": {"max_autotune": True}})  # engine_flags' value
_WARP = {"cuda": 32, "rocm": 64}


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


def build_image(
    tree: Path,
    manifest: Manifest,
    scratch: Path,
    *,
    runtime_image: str | None = None,
    model_uri: str | None = None,
    cache_path: str = DEFAULT_CACHE_PATH,
    ranks: tuple[int, ...] = (0,),
) -> KernelCacheImage:
    """The kernel-cache image of an installed vLLM graphs tree and its manifest (layer written under
    `scratch`), its absolute paths rewritten for a container whose VLLM_CACHE_ROOT is `cache_path`;
    `ranks`: the ranks whose compile cache the caller checked the tree holds (a label)."""
    cache = tree / TREE_CACHE
    if manifest.kind != "graphs" or "vllm" not in manifest.key or not cache.is_dir():
        raise KernelCacheError(
            f"{manifest.kind} {manifest.key_digest[:16]} is not a vLLM graphs bundle (no {TREE_CACHE}/ and no vllm key "
            f"group); kernel-cache images are made from the graphs of a recipe with engine = 'vllm'"
        )
    entries = cache_entries(cache)
    inductor = (cache / INDUCTOR_DIR).is_dir()
    if not entries and not inductor:
        raise KernelCacheError(
            f"{cache} holds no vLLM compile cache (no torch_compile_cache/<hash>/rank_*/ folder and no "
            f"{INDUCTOR_DIR}/); rebake the graphs"
        )
    factors = footprint_factors(manifest)
    footprint = None
    if runtime_image and model_uri:
        footprint = compatibility_footprint(runtime_image, model_uri, factors)
    mcv = {"vllm": [{k: v for k, v in e.items() if k != "aot"} for e in entries]}
    formats = {"aot_compile" if e.get("aot") else b["cache_save_format"] for e in entries for b in e["binary"]}
    formats |= {"inductor"} if inductor else set()
    scratch.mkdir(parents=True, exist_ok=True)
    layer = scratch / "layer.tar.gz"
    relocate = Relocation(_baked_root(tree), cache_path.rstrip("/"))
    diff_id, size = _write_layer(
        layer, cache, json.dumps(mcv, indent=1, sort_keys=True).encode(), manifest.to_bytes(), relocate
    )
    labels = {
        LABEL + "entry-count": str(len(entries)),
        LABEL + "cache-size-bytes": str(size),  # the bytes of io.vllm.cache/'s files in the layer
        LABEL + "format": ",".join(sorted(formats)),
        LABEL + "summary": json.dumps({"targets": [summary_target(manifest, entries)]}, separators=(",", ":")),
        RANKS: ",".join(str(r) for r in ranks),
        **{FACTOR + k: v for k, v in factors.items()},
    }
    if footprint:
        labels[FOOTPRINT] = footprint
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
    annotations = {
        LABEL + "variant": "compat",
        "org.prebake.manifest.digest": sha256(manifest.to_bytes()),
        "org.prebake.blob": manifest.blob.digest,
        "org.prebake.key-digest": manifest.key_digest,
        "org.opencontainers.image.title": f"vLLM kernel cache {manifest.labels.get('model', '')} {manifest.key_digest[:12]}",
        **{FACTOR + k: v for k, v in factors.items()},
        CACHE_PATH: relocate.cache_path,
        RELOCATED: str(relocate.rewritten),
    }
    if footprint:
        annotations[FOOTPRINT] = footprint
    body = canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": config_ref.descriptor(),
            "layers": [layer_ref.descriptor()],
            "annotations": annotations,
        }
    )
    return KernelCacheImage(layer, layer_ref, config, config_ref, body, sha256(body), factors, labels, footprint)


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


def footprint_factors(manifest: Manifest) -> dict[str, str]:
    """KServe's compatibility factors of the vLLM command line the graphs were baked with, its normalization."""
    vllm = manifest.key["vllm"]
    options = manifest.key.get("options", {})
    dtype, quantization = _DTYPES.get(str(vllm.get("dtype")), (str(vllm.get("dtype")), None))
    out = {
        "option.tensorParallelSize": _integer(vllm.get("tensor-parallel-size")),
        "option.maxModelLen": _integer(vllm.get("max-model-len")),
        "option.dtype": dtype.lower(),
        "option.blockSize": _integer(vllm.get("block-size")),
        "option.maxNumBatchedTokens": _integer(vllm.get("max-num-batched-tokens")),
        "option.maxNumSeqs": _integer(vllm.get("max-num-seqs")),
    }
    if quantization:
        out["option.quantization"] = quantization
    if options.get("mode") == "max-autotune-no-cudagraphs":
        out["option.compilationConfigHash"] = hash_strings([_AUTOTUNE_CONFIG])
    for name in ("VLLM_USE_AOT_COMPILE", "VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_USE_STANDALONE_COMPILE"):
        if name in vllm:
            out[f"env.{name}"] = _boolean(str(vllm[name]))
    return {k: v for k, v in out.items() if v}


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


def cache_entries(cache: Path) -> list[dict[str, Any]]:
    """MCV's manifest entries of a vLLM cache root: one per hash folder of torch_compile_cache/
    (and of torch_compile_cache/torch_aot_compile/), with its rank/prefix folders."""
    root = cache / "torch_compile_cache"
    hashes = (
        [p for p in sorted(root.iterdir()) if p.is_dir() and p.name != "torch_aot_compile"] if root.is_dir() else []
    )
    aot = root / "torch_aot_compile"
    hashes += [p for p in sorted(aot.iterdir()) if p.is_dir()] if aot.is_dir() else []
    entries = []
    for folder in hashes:
        binary = []
        for rank in sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("rank_")):
            prefixes = [p for p in sorted(rank.iterdir()) if p.is_dir()] or [rank]
            for prefix in prefixes:
                binary.append(_binary_entry(rank.name, prefix))
        if binary:
            entry = {"vllmHash": folder.name, "cacheFormat": "binary", "binary": binary}
            entries.append(entry | ({"aot": True} if folder.parent == aot else {}))
    return entries


def summary_target(manifest: Manifest, entries: list[dict[str, Any]]) -> dict[str, object]:
    """The accelerator the graphs were compiled for, as MCV's summary names one target."""
    platform = manifest.key.get("platform", {})
    devices = {b["target_device"] for e in entries for b in e["binary"] if b["target_device"]}
    backend = next(iter(sorted(devices)), "") or str(platform.get("device") or "cpu")
    target: dict[str, object] = {"backend": backend, "arch": str(platform.get("arch", ""))}
    if backend in _WARP:
        target["warp_size"] = _WARP[backend]
    cuda = str(manifest.key.get("software", {}).get("cuda_runtime", ""))
    if backend == "cuda" and cuda not in ("", "none"):
        target["cuda_version"] = cuda
    return target


def _binary_entry(rank: str, prefix: Path) -> dict[str, object]:
    factors: dict[str, Any] = {}
    path = prefix / "cache_key_factors.json"
    if path.is_file():
        try:
            loaded = json.loads(path.read_text())
            factors = loaded if isinstance(loaded, dict) else {}
        except ValueError as exc:
            raise KernelCacheError(f"{path} is not JSON ({exc}); rebake the graphs") from exc
    artifacts = sorted(p for p in prefix.iterdir() if p.name.startswith("artifact_compile_range_"))
    env: dict[str, Any] = factors["env"] if isinstance(factors.get("env"), dict) else {}
    return {
        "rank": rank,
        "prefix": prefix.name,
        "artifact_count": len(artifacts),
        "artifact_names": [p.name for p in artifacts],
        "code_hash": str(factors.get("code_hash", "")),
        "config_hash": str(factors.get("config_hash", "")),
        "compiler_hash": str(factors.get("compiler_hash", "")),
        "cache_save_format": "unpacked" if any(p.is_dir() for p in artifacts) else "binary",
        "target_device": str(env.get("VLLM_TARGET_DEVICE", "")),
        "env": env,
    }


@dataclass
class Relocation:
    """The absolute paths a vLLM cache root carries, rewritten from the bake's root to the container's
    (as prebake.engine.vllm.portability.relocate does for a served copy): the standalone artifact
    handles in vllm_compile_cache.py, and Triton's group files, which list their siblings by path."""

    baked_root: str | None
    cache_path: str
    rewritten: int = 0

    def __call__(self, rel: str, data: bytes) -> bytes:
        name = rel.rsplit("/", 1)[-1]
        if name == HANDLES_FILE and self.baked_root and self.baked_root != self.cache_path:
            new = data.replace((self.baked_root + "/").encode(), (self.cache_path + "/").encode())
        elif name.startswith(GROUP_PREFIX) and name.endswith(".json"):
            new = self._group(rel, data)
        else:
            return data
        self.rewritten += new != data
        return new

    def _group(self, rel: str, data: bytes) -> bytes:
        try:
            document = json.loads(data)
            children = document["child_paths"]
        except (ValueError, KeyError, TypeError):
            return data  # not a group file Triton wrote: as it is
        if not isinstance(children, dict):
            return data
        folder = posixpath.join(self.cache_path, posixpath.dirname(rel))
        moved = {k: posixpath.join(folder, posixpath.basename(str(v))) for k, v in children.items()}
        return json.dumps({**document, "child_paths": moved}).encode()


def _baked_root(tree: Path) -> str | None:
    """The cache root the bake ran vLLM with (vllm.json's site), which vLLM wrote into its handles."""
    try:
        root = json.loads((tree / REPORT_FILE).read_text())["site"]["cache_root"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(root).rstrip("/") if root else None


def _write_layer(
    out: Path, cache: Path, mcv: bytes, prebake_manifest: bytes, rewrite: Callable[[str, bytes], bytes]
) -> tuple[str, int]:
    """Write the tar+gzip layer; the sha256 of the uncompressed tar (its diff_id) and the bytes of the
    cache's regular files in it."""
    digest, size = hashlib.sha256(), 0

    class _Hashing(io.RawIOBase):
        def __init__(self, sink: gzip.GzipFile):
            self.sink = sink

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            digest.update(data)
            self.sink.write(data)
            return len(data)

    with out.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=_Hashing(gz), mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in (CACHE_DIR, MANIFEST_DIR, PREBAKE_DIR):
                tar.addfile(_info(name + "/", tarfile.DIRTYPE, 0o755))
            for path in sorted(cache.rglob("*")):
                rel = f"{CACHE_DIR}/{path.relative_to(cache).as_posix()}"
                if path.is_symlink():
                    info = _info(rel, tarfile.SYMTYPE, 0o777)
                    info.linkname = os.readlink(path)
                    tar.addfile(info)
                elif path.is_dir():
                    tar.addfile(_info(rel + "/", tarfile.DIRTYPE, 0o755))
                elif _lock_file(path):
                    continue  # see _lock_file
                else:
                    info = _info(rel, tarfile.REGTYPE, 0o755 if os.access(path, os.X_OK) else 0o644)
                    if path.name == HANDLES_FILE or path.name.startswith(GROUP_PREFIX):
                        data = rewrite(path.relative_to(cache).as_posix(), path.read_bytes())
                        info.size = len(data)
                        size += info.size
                        tar.addfile(info, io.BytesIO(data))
                        continue
                    info.size = path.stat().st_size
                    size += info.size
                    with path.open("rb") as f:
                        tar.addfile(info, f)
            for rel, data in (
                (f"{MANIFEST_DIR}/manifest.json", mcv),
                (f"{PREBAKE_DIR}/manifest.json", prebake_manifest),
            ):
                info = _info(rel, tarfile.REGTYPE, 0o644)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return "sha256:" + digest.hexdigest(), size


def _lock_file(path: Path) -> bool:
    """An empty *.lock file (Inductor's inductor_cache/locks/): left out of the image. It holds
    nothing, and linked in by `cp -sr` it cannot be opened: Inductor's file lock refuses a symbolic
    link (ELOOP), so vLLM would fail to start; its folder stays, and Inductor makes the lock anew."""
    return path.suffix == ".lock" and path.stat().st_size == 0


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.rstrip("/"))
    info.type, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = kind, mode, 0, 0, 0, "", ""
    return info


def _integer(value: object) -> str:
    try:
        parsed = int(str(value))
    except ValueError:
        return ""
    return str(parsed) if parsed > 0 else ""


def _boolean(value: str) -> str:
    lowered = value.strip().lower()
    if lowered in ("1", "t", "true"):
        return "true"
    if lowered in ("0", "f", "false"):
        return "false"
    return ""


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
