"""vLLM on Gaudi: the bucket set as vllm-gaudi's variables, and the HPU recipe cache (hpu-recipes/,
beside vllm-cache/ in the graphs tree) as an artifact.

The bridge reads PT_HPU_RECIPE_CACHE_CONFIG=<path>,<delete>,<size MB>: the bake stores every
bucket's recipe into an empty folder (<build>/hpu-recipes,True,<size>), a serve reuses a local
copy of the installed tree (<copy>,False,<size>), never the store's own. A hit skips the GC graph
compile, not the HPU graph compile; recipes are valid for one Gaudi generation, software version,
TP size and dtype, all in the graphs key. The folder must be on local disk (the bridge's file
locks do not work on NFS): a network file system is reported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from prebake.artifacts.buckets import rules as bucket_rules
from prebake.artifacts.buckets.artifact import check_overrides
from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.buckets.sets import BucketSet
from prebake.artifacts.errors import BucketError, BuildError
from prebake.artifacts.recipe.kinds import BUCKETS_FILE
from prebake.artifacts.recipe.schema import Recipe
from prebake.engine.vllm.gaudi_file import write_bucket_file

RECIPES_DIR = "hpu-recipes"
BUCKET_FILE = "vllm-gaudi-buckets.txt"  # a traffic-fitted set, as VLLM_BUCKETING_FROM_FILE reads it
RECIPE_CACHE_ENV = "PT_HPU_RECIPE_CACHE_CONFIG"
DEFAULT_CACHE_MB = 8192  # the size vLLM's Gaudi guide uses for Llama-3.1-8B
# BucketSettings field -> the vllm-gaudi variable prefix that sets the same range.
RANGE_VARIABLES = {
    "prompt_bs": "VLLM_PROMPT_BS",
    "prompt_seq": "VLLM_PROMPT_QUERY",  # VLLM_PROMPT_SEQ_* is the deprecated fallback name
    "prompt_ctx": "VLLM_PROMPT_CTX",
    "decode_bs": "VLLM_DECODE_BS",
    "decode_block": "VLLM_DECODE_BLOCK",
}
_UPSTREAM_NAMES = {"exponential": "exp", "linear": "lin", "pad": "pad"}
_NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "glusterfs", "ceph", "9p")


def recipe_cache_config(path: Path, delete: bool, size_mb: int) -> str:
    """The PT_HPU_RECIPE_CACHE_CONFIG value; the bridge splits it on commas, so paths may not hold one."""
    if "," in str(path):
        raise BuildError(
            f"HPU recipe cache folder {path} contains a comma, which "
            f"{RECIPE_CACHE_ENV} cannot carry; use a folder without commas"
        )
    if size_mb <= 0:
        raise BuildError(f"HPU recipe cache size must be positive, not {size_mb} MB")
    return f"{path},{delete},{size_mb}"


def parse_recipe_cache_config(value: str) -> tuple[Path, bool, int]:
    """(folder, delete, size MB) from a PT_HPU_RECIPE_CACHE_CONFIG value."""
    try:
        path, delete, size = value.rsplit(",", 2)
        flag = {"true": True, "false": False}[delete.strip().lower()]
        return Path(path), flag, int(size)
    except (ValueError, KeyError) as exc:
        raise BuildError(f"{RECIPE_CACHE_ENV}={value!r} is not '<path>,<True|False>,<size MB>'") from exc


def bucket_variables(recipe: Recipe, buckets_tree: Path | None = None, folder: Path | None = None) -> dict[str, str]:
    """vllm-gaudi's bucket variables (and strategy) that reproduce the recipe's bucket set.

    The rule-based strategies are variables; a traffic-fitted set has no rule, so the baked set
    (buckets.json in `buckets_tree`) is written as upstream's VLLM_BUCKETING_FROM_FILE into `folder`.
    """
    if recipe.buckets.strategy == "traffic" and buckets_tree is not None and folder is not None:
        baked = BucketSet.from_json(json.loads((buckets_tree / BUCKETS_FILE).read_text()))
        bucket_file = write_bucket_file(baked, folder / BUCKET_FILE)
        return vllm_gaudi_env(recipe.serving, recipe.buckets, bucket_file=bucket_file)
    return vllm_gaudi_env(recipe.serving, recipe.buckets)


def build_variables(recipe: Recipe, out: Path, buckets_tree: Path | None = None) -> dict[str, str]:
    """A Gaudi bake's variables: buckets, and an empty recipe folder inside the artifact tree."""
    folder = out / RECIPES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    buckets = bucket_variables(recipe, buckets_tree, out)
    return buckets | {RECIPE_CACHE_ENV: recipe_cache_config(folder, True, DEFAULT_CACHE_MB)}


def hpu_variables(recipe: Recipe, local_recipes: Path, buckets_tree: Path | None = None) -> dict[str, str]:
    """A Gaudi server's variables: the same buckets, and its local copy of the recipes, reused."""
    size = max(DEFAULT_CACHE_MB, 2 * folder_mb(local_recipes))  # never below what is there: it would evict
    buckets = bucket_variables(recipe, buckets_tree, local_recipes.parent)
    return buckets | {RECIPE_CACHE_ENV: recipe_cache_config(local_recipes, False, size)}


def folder_mb(folder: Path) -> int:
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return math.ceil(total / (1 << 20))


def filesystem_type(path: Path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """The file system type of the mount holding `path` (longest matching mount point)."""
    try:
        rows = [line.split() for line in mounts.read_text().splitlines()]
    except OSError:
        return None
    target = str(path.resolve())
    best: tuple[int, str] | None = None
    for row in rows:
        if len(row) >= 3:
            point = row[1]
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and (best is None or len(point) > best[0]):
                best = (len(point), row[2])
    return best[1] if best else None


def local_disk_problem(path: Path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """Why `path` is a bad place for a recipe cache, or None when it is on local disk."""
    kind = filesystem_type(path, mounts)
    if kind and (kind in _NETWORK_FILESYSTEMS or kind.startswith("fuse.")):
        return (
            f"{path} is on a {kind} file system, which has no working file locks; the Gaudi bridge needs "
            f"its recipe cache on local disk: point --cache-root at a local folder"
        )
    return None


def vllm_gaudi_env(limits: ServingLimits, settings: BucketSettings, bucket_file: Path | None = None) -> dict[str, str]:
    """The environment that makes vllm-gaudi build the same buckets as build_bucket_set.

    The caller hands it to the server process; nothing here touches os.environ. Exponential takes
    no ranges, only the prefill batch (VLLM_PROMPT_BS_BUCKET_MAX); its decode blocks follow the
    device's KV block count, so pass limits.num_device_blocks for an exact match. Linear sets
    every range; pad only the recipe's overrides. Traffic sets have no rule upstream: export them
    with gaudi_file.write_bucket_file and pass that file here.
    """
    check_overrides(limits, settings)
    contiguous = "false" if limits.enable_prefix_caching else "true"
    if settings.strategy == "traffic":
        if bucket_file is None:
            raise BucketError(
                "a traffic bucket set reaches vllm-gaudi only as a file: write it with "
                "prebake.engine.vllm.gaudi_file.write_bucket_file and pass bucket_file"
            )
        return {"VLLM_BUCKETING_FROM_FILE": str(bucket_file), "VLLM_CONTIGUOUS_PA": contiguous}
    env = {"VLLM_BUCKETING_STRATEGY": _UPSTREAM_NAMES[settings.strategy], "VLLM_CONTIGUOUS_PA": contiguous}
    if settings.strategy != "pad":  # deprecated but still read, and it wins when set: pad must leave it out
        env["VLLM_EXPONENTIAL_BUCKETING"] = "true" if settings.strategy == "exponential" else "false"
    if settings.strategy == "exponential":
        return env | {"VLLM_PROMPT_BS_BUCKET_MAX": str(limits.prefill_seqs)}
    configs = bucket_rules.configs(limits, settings)
    names = ("MIN", "STEP", "MAX", "PAD_MAX", "PAD_PERCENT")
    for field, config in configs.items():
        if settings.strategy == "pad" and getattr(settings, field) is None and field != "prompt_bs":
            continue
        for name, value in zip(names, config):
            if settings.strategy == "pad" and field == "prompt_bs" and settings.prompt_bs is None and name != "MAX":
                continue
            env[f"{RANGE_VARIABLES[field]}_BUCKET_{name}"] = str(value)
    return env
