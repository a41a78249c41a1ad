"""A vLLM cache root as a kernel-cache image describes it: the one place that reads the layout of a
baked graphs tree for an image (prebake.engine.vllm.process draws the tree):

    vllm-cache/                                          the graphs tree's VLLM_CACHE_ROOT
        torch_compile_cache/<hash>/rank_<r>_<dp>/<prefix>/   cache_key_factors.json, artifact_compile_range_*
        torch_compile_cache/torch_aot_compile/<hash>/rank_<r>_<dp>/   AOT compile's forward
        inductor_cache/                                  Inductor's own cache (CPU: AOT compile off)
    vllm.json                                            the bake's report: the cache root vLLM ran with

    read_cache_tree(tree, manifest, cache_path)  ->  CacheTree   MCV's entries, the formats, the summary's
                                                         target, KServe's factors, and the files'
                                                         relocation to the container's cache root

Reads the tree only; the image itself (layer, config, manifest) is prebake.registry.oci.kernel_cache's.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prebake.artifacts.bundle.manifest import Manifest
from prebake.engine.vllm.portability import GROUP_PREFIX, HANDLES_FILE
from prebake.engine.vllm.process import AUTOTUNE_CONFIG, CACHE_DIR, INDUCTOR_DIR, read_report
from prebake.registry.oci.kernel_cache import CacheTree, KernelCacheError, hash_strings

DEFAULT_CACHE_PATH = "/root/.cache/vllm"  # where KServe puts the cache when the container sets no VLLM_CACHE_ROOT
_COMPILED = "torch_compile_cache"
_AOT = "torch_aot_compile"
_DTYPES = {"fp32": ("float32", None), "bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "fp8")}
_WARP = {"cuda": 32, "rocm": 64}
_SWITCHES = ("VLLM_USE_AOT_COMPILE", "VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_USE_STANDALONE_COMPILE")


def read_cache_tree(tree: Path, manifest: Manifest, cache_path: str = DEFAULT_CACHE_PATH) -> CacheTree:
    """The cache root of an installed vLLM graphs tree as its image's layer and labels take it, its
    absolute paths to be rewritten for a container whose VLLM_CACHE_ROOT is `cache_path`."""
    cache = tree / CACHE_DIR
    if manifest.kind != "graphs" or "vllm" not in manifest.key or not cache.is_dir():
        raise KernelCacheError(
            f"{manifest.kind} {manifest.key_digest[:16]} is not a vLLM graphs bundle (no {CACHE_DIR}/ and no vllm key "
            f"group); kernel-cache images are made from the graphs of a recipe with engine = 'vllm'"
        )
    entries = cache_entries(cache)
    inductor = (cache / INDUCTOR_DIR).is_dir()
    if not entries and not inductor:
        raise KernelCacheError(
            f"{cache} holds no vLLM compile cache (no {_COMPILED}/<hash>/rank_*/ folder and no "
            f"{INDUCTOR_DIR}/); rebake the graphs"
        )
    formats = {"aot_compile" if e.get("aot") else b["cache_save_format"] for e in entries for b in e["binary"]}
    return CacheTree(
        root=cache,
        entries=tuple({k: v for k, v in e.items() if k != "aot"} for e in entries),
        formats=frozenset(formats | ({"inductor"} if inductor else set())),
        target=summary_target(manifest, entries),
        factors=footprint_factors(manifest),
        files=Relocation(_baked_root(tree), cache_path.rstrip("/")),
    )


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
        out["option.compilationConfigHash"] = hash_strings([AUTOTUNE_CONFIG])
    for name in _SWITCHES:
        if name in vllm:
            out[f"env.{name}"] = _boolean(str(vllm[name]))
    return {k: v for k, v in out.items() if v}


def cache_entries(cache: Path) -> list[dict[str, Any]]:
    """MCV's manifest entries of a vLLM cache root: one per hash folder of torch_compile_cache/
    (and of torch_compile_cache/torch_aot_compile/, marked "aot"), with its rank/prefix folders."""
    root = cache / _COMPILED
    hashes = [p for p in sorted(root.iterdir()) if p.is_dir() and p.name != _AOT] if root.is_dir() else []
    aot = root / _AOT
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
    handles in vllm_compile_cache.py, and Triton's group files, which list their siblings by path.
    Empty Inductor lock files stay out: see `leaves_out`."""

    baked_root: str | None
    cache_path: str
    rewritten: int = 0

    def rewrites(self, name: str) -> bool:
        return name == HANDLES_FILE or name.startswith(GROUP_PREFIX)

    def leaves_out(self, path: Path) -> bool:
        """An empty *.lock file (Inductor's inductor_cache/locks/): it holds nothing, and linked in by
        `cp -sr` it cannot be opened: Inductor's file lock refuses a symbolic link (ELOOP), so vLLM
        would fail to start; its folder stays, and Inductor makes the lock anew."""
        return path.suffix == ".lock" and path.stat().st_size == 0

    def rewrite(self, rel: str, data: bytes) -> bytes:
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
        root = read_report(tree)["site"]["cache_root"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(root).rstrip("/") if root else None


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
