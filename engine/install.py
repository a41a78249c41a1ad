"""Pointing an engine at installed bundles: the one place that decides cache environment variables.

The environment is returned as a mapping, never written into this process's os.environ:
callers hand it to a child process or print it (`prebake fetch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from artifacts.store import Installed

from .builders import AUTOTUNE_FILE, BUCKETS_FILE, INDUCTOR_DIR

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


def vllm_build_environment(plan, out: Path, base: Mapping[str, str]) -> dict[str, str]:
    """A vLLM bake child's environment: its cache root (and on Gaudi its recipe cache and
    bucket variables) inside the artifact tree `out`, nothing shared."""
    from .adapters import gaudi, vllm

    env = vllm.build_environment(plan.recipe, plan.target, out / vllm.CACHE_DIR, base)
    if _on_gaudi(plan):
        env.update(gaudi.build_variables(plan.recipe, out))
    return env


def vllm_environment(plan, graphs: Installed | None, cache_root: Path) -> dict[str, str]:
    """Variables that start vLLM from the installed graphs: a private writable copy of the baked
    cache root under `cache_root` (empty on a miss: vLLM compiles into it), and on Gaudi the
    bucket variables and the local copy of the HPU recipes, reused."""
    from .adapters import gaudi, vllm

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
