"""Pointing an engine at installed bundles: the one place that decides cache environment variables.

The environment is returned as a mapping: callers hand it to a child process or print it
(`prebake fetch`). The one exception is the bundled engine's serving process, which compiles
in itself: `activate` applies its environment once, before torch compiles anything.

Inductor writes into its cache folder (locks, new entries), so the serving engine never
points it at a store tree: it gets a private, writable copy (`private_graphs_tree`).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from artifacts.errors import StoreError
from artifacts.store import Installed
from engine.builders import AUTOTUNE_FILE, BUCKETS_FILE, INDUCTOR_DIR

BUCKETS_ENV = "PREBAKE_BUCKETS_FILE"
AUTOTUNE_ENV = "PREBAKE_AUTOTUNE_FILE"
GRAPHS_ENV = "PREBAKE_GRAPHS_DIR"


def prebake_environment(installed: Mapping[str, Installed]) -> dict[str, str]:
    """Variables that point the bundled engine (and plain torch.compile users) at the bundles."""
    env: dict[str, str] = {}
    if "buckets" in installed:
        env[BUCKETS_ENV] = str(installed["buckets"].tree / BUCKETS_FILE)
    if "autotune" in installed:
        env[AUTOTUNE_ENV] = str(installed["autotune"].tree / AUTOTUNE_FILE)
    if "graphs" in installed:
        env[GRAPHS_ENV] = str(installed["graphs"].tree)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(installed["graphs"].tree / INDUCTOR_DIR)
    return env


def shell_exports(env: Mapping[str, str]) -> str:
    import shlex

    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items()))


def private_graphs_tree(installed: Installed | None, run_dir: Path) -> Path:
    """A writable graphs tree for one serving process: a copy of the installed one, or an empty
    one to compile into. The store's tree is only read."""
    dest = run_dir / "graphs"
    if installed is None:
        (dest / INDUCTOR_DIR).mkdir(parents=True)
        return dest
    shutil.copytree(installed.tree, dest)
    for folder, _, files in os.walk(dest):  # bundles unpack 0644/0755; Inductor needs to write beside them
        os.chmod(folder, 0o755)
        for name in files:
            path = Path(folder, name)
            os.chmod(path, path.stat().st_mode | 0o200)
    (dest / INDUCTOR_DIR).mkdir(exist_ok=True)
    return dest


def engine_environment(graphs_tree: Path) -> dict[str, str]:
    """Variables the serving process compiles under: Inductor's cache inside its private graphs tree."""
    return {GRAPHS_ENV: str(graphs_tree), "TORCHINDUCTOR_CACHE_DIR": str(graphs_tree / INDUCTOR_DIR)}


def activate(env: Mapping[str, str]) -> None:
    """Apply `env` to this process. Only the serving process calls this, once, before any compile:
    Inductor caches paths derived from its cache folder after the first use."""
    if "torch._inductor.codecache" in sys.modules and os.environ.get("TORCHINDUCTOR_CACHE_DIR") != env.get(
        "TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    ):
        raise StoreError(
            "Inductor is already loaded in this process with another cache folder, so the installed graphs "
            "would be ignored; start the engine in a fresh process (prebake serve)"
        )
    os.environ.update(env)


def vllm_build_environment(plan, out: Path, base: Mapping[str, str]) -> dict[str, str]:
    """A vLLM bake child's environment: its cache root (and on Gaudi its recipe cache and
    bucket variables) inside the artifact tree `out`, nothing shared."""
    from engine.adapters import gaudi, vllm

    env = vllm.build_environment(plan.recipe, plan.target, out / vllm.CACHE_DIR, base)
    if _on_gaudi(plan):
        env.update(gaudi.build_variables(plan.recipe, out))
    return env


def vllm_environment(plan, graphs: Installed | None, cache_root: Path) -> dict[str, str]:
    """Variables that start vLLM from the installed graphs: a private writable copy of the baked
    cache root under `cache_root` (empty on a miss: vLLM compiles into it), and on Gaudi the
    bucket variables and the local copy of the HPU recipes, reused."""
    from engine.adapters import gaudi, vllm

    def private(name: str) -> Path:
        if graphs is not None and (graphs.tree / name).is_dir():
            return vllm.writable_copy(graphs.tree / name, cache_root / name)
        (cache_root / name).mkdir(parents=True, exist_ok=True)
        return cache_root / name

    env = vllm.serving_variables(plan.recipe, plan.target, private(vllm.CACHE_DIR))
    if _on_gaudi(plan):
        env.update(gaudi.serving_variables(plan.recipe, private(gaudi.RECIPES_DIR)))
    return env


def _on_gaudi(plan) -> bool:
    from artifacts.recipes import parse_platform

    return parse_platform(plan.target.platform)[0] == "gaudi"
