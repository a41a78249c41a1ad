"""The environment `prebake fetch` prints: every installed kind's declared variables, as shell exports."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from prebake.artifacts.recipe.kinds import KindTable
from prebake.artifacts.store.local import Installed


def prebake_environment(kinds: KindTable, installed: Mapping[str, Installed]) -> dict[str, str]:
    """Variables that point the bundled engine (and plain torch.compile users) at the bundles:
    each installed kind's declared environment."""
    env: dict[str, str] = {}
    for kind in kinds:
        if kind.name in installed:
            env.update(kind.environment(installed[kind.name].tree))
    return env


def shell_exports(env: Mapping[str, str]) -> str:
    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items()))
