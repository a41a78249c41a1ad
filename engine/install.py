"""Pointing an engine at installed bundles: the one place that decides cache environment variables.

The environment is returned as a mapping, never written into this process's os.environ:
callers hand it to a child process or print it (`prebake fetch`).
"""

from __future__ import annotations

from collections.abc import Mapping

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
