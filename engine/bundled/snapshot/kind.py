"""The `snapshot` artifact kind: a warm bundled engine, parked before it binds its port, dumped
with CRIU (dump.py) at the bake, from the bake's own buckets, autotune and graphs bundles.

A recipe asks for it with `[snapshot] bake = true`; its table then lists it after graphs. Its key
holds the target's groups (model, software, platform, tp, dtype), the upstream digests, and what a
restore needs of the host beside the files (host.key_factors: CRIU's version, the kernel, the CPU's
flags); the files the process maps are recorded in the tree with their digests and checked before
a restore (files.py), so a host whose libraries or weights differ is refused with the file named.
"""

from __future__ import annotations

import os
from pathlib import Path

from prebake import __version__
from prebake.artifacts.errors import BuildError
from prebake.artifacts.recipe.kinds import BuildRequest, Groups, KeyContext, Kind, target_groups
from prebake.artifacts.recipe.schema import RANDOM_CHECKPOINT, RANDOM_WEIGHTS, Recipe, Target
from prebake.artifacts.store.settings import default_home
from prebake.engine.bundled.runtime import openmp
from prebake.engine.bundled.snapshot.host import Able, can_snapshot, key_factors
from prebake.engine.bundled.snapshot.image import FORMAT, IMAGES_DIR, INFO_FILE

NAME = "snapshot"
VARIANT = "aoti-package"  # reads its graphs tree in place: nothing the process maps is in a scratch folder
DIGESTS_FILE = "snapshot-digests.json"  # the stat cache of files.DigestCache: once a machine, not a store


def _groups(context: KeyContext) -> Groups:
    able = can_snapshot()
    host = key_factors(able) if isinstance(able, Able) else {"criu": "unavailable"}
    # prebake's version: the image holds prebake's code as the bake loaded it, and speaks its protocol
    return {**target_groups(context), "snapshot": {**host, "format": str(FORMAT), "prebake": __version__}}


def _build(request: BuildRequest) -> None:
    from prebake.engine.bundled.snapshot.dump import dump

    plan = request.plan
    able = can_snapshot()
    if not isinstance(able, Able):
        raise BuildError(f"cannot bake a snapshot of {plan.target.name} on this host: {able.reason}")
    if plan.target.tp != 1:
        raise BuildError(
            f"{plan.target.name}: snapshots are baked of one process; a tp {plan.target.tp} target runs "
            f"{plan.target.tp} ranks: bake its snapshot at tp 1 (doit bake tp=1) or remove [snapshot]"
        )
    if (variant := plan.recipe.compile.variant_or(VARIANT)) != VARIANT:
        raise BuildError(
            f"recipe {plan.recipe.model.name}: snapshots are baked of the {VARIANT} graphs variant (read in "
            f"place), not {variant}; set [compile] variant = {VARIANT!r} or remove [snapshot]"
        )
    spec = {"model": plan.recipe.model.name, "precision": plan.target.dtype}  # the bake's store holds its inputs
    env = {**os.environ, **openmp.for_snapshot(os.environ), "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    weights = lambda: weights_files(plan.recipe, plan.target.dtype)  # noqa: E731 (asked once parked: its start may write one)
    info = dump(spec, request.out, able, env, lambda line: print(line, flush=True), digest_cache(), weights)
    info.write(request.out)


def weights_files(recipe: Recipe, dtype: str) -> list[str]:
    """Every file of the model's weights folder (a GGUF's: its folder dequantized to `dtype`):
    recorded whether the process still maps them or copied them into its memory, so an image whose
    weights changed since the bake is never restored; never carried, wherever they lie."""
    spec = recipe.model
    if spec.weights == RANDOM_WEIGHTS:
        return []  # made in memory from the seed: in the image, and in the key through the recipe
    if spec.weights == RANDOM_CHECKPOINT:
        from prebake.engine.bundled.runtime.checkpoint import checkpoint_folder

        folder = checkpoint_folder(spec, default_home())
    elif spec.gguf is not None:
        from prebake.engine.bundled.runtime.gguf_folder import gguf_folder_path
        from prebake.engine.bundled.runtime.loader import torch_dtype

        folder = gguf_folder_path(spec, torch_dtype(dtype), default_home())
    else:
        folder = Path(spec.weights).expanduser()
    return sorted(str(p) for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def digest_cache() -> Path:
    """The machine's digest cache (~/.cache/prebake, or $XDG_CACHE_HOME/prebake): every store on
    it, a fresh one included, checks the files it shares with the others without hashing them again."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prebake" / DIGESTS_FILE


def wanted(recipe: Recipe, target: Target) -> tuple[Kind, ...]:
    """The snapshot kind when the recipe asks for it, for its tp 1 targets (one process), else none."""
    return (SNAPSHOT,) if recipe.snapshot.bake and target.tp == 1 else ()


SNAPSHOT = Kind(
    name=NAME,
    upstream=("buckets", "autotune", "graphs"),
    groups=_groups,
    outputs=(INFO_FILE, IMAGES_DIR),
    build=_build,
    environment=lambda tree: {"PREBAKE_SNAPSHOT_TREE": str(tree)},  # for an operator's own `criu restore`
)
