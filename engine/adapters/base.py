"""The engine-adapter interface: what an engine needs from prebake, and what it gives back.

An adapter declares, for recipes it serves (`handles`):

    kinds()              the artifact kinds it compiles, after the shared buckets kind: what its
                         autotune and graphs artifacts are, how each is built and keyed
    compiled_kind        the kind the engine produces by itself when it starts on a miss
    serve_environment()  the variables that start the engine from installed trees

Adapters are looked up by `engine.adapters.adapter_for(recipe, target)`; nothing else in the
code asks which engine a recipe names.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from artifacts.errors import PrebakeError
from artifacts.kinds import Kind, Plan
from artifacts.recipes import Recipe, Target
from artifacts.store import Installed


class EngineStartError(PrebakeError, RuntimeError):
    """An engine started by an adapter exited, or did not become ready in time."""


class EngineAdapter(Protocol):
    """One serving engine: its compiled artifacts and how it starts from them."""

    name: str  # the recipe's [model] engine
    compiled_kind: str

    def handles(self, recipe: Recipe, target: Target) -> bool:
        """Whether this adapter serves `recipe` on `target`."""
        ...

    def kinds(self) -> tuple[Kind, ...]:
        """The kinds this engine compiles, in build order, after the shared buckets kind."""
        ...

    def serve_environment(self, plan: Plan, installed: Mapping[str, Installed], run_dir: Path) -> dict[str, str]:
        """Variables that start the engine from the installed trees, with private writable copies
        under `run_dir` wherever the engine writes beside what it reads."""
        ...
