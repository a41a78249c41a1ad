"""The graphs-variant interface: one way of compiling the bundled engine's step shapes into a
graphs tree at bake and of loading them back at start (as vLLM's CompilerInterface is one way of
compiling its graphs). A variant is one module under engine/bundled/variants/ and one
registration in its __init__; the mechanics stay in engine/bundled/runtime/.

The build calls `compile`; the start walks the chain (`load`, and on NotLoaded the variant
`next_in` names) and compiles in place at its end. torch is imported inside the methods only:
the adapter reads these classes in a parent that never imports torch.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from prebake.artifacts.recipe.schema import CompileOptions, Target
from prebake.engine.bundled.runtime.parallel import Parallel  # torch-free: this process's place in a tp group
from prebake.engine.bundled.runtime.shapes import StepShape

if TYPE_CHECKING:  # torch's types, for the annotations only
    from prebake.engine.bundled.runtime.aoti_workers import Workers
    from prebake.engine.bundled.runtime.model import KVCache, Llama
    from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic

Log = Callable[[str], None]
GRAPHS_FILE = "graphs.json"  # in every variant's tree: the variant, its fallback, the shapes (build.py writes it)
INDUCTOR_DIR = "inductor"  # Inductor's cache folder, in a tree whose variant has one


@dataclass(frozen=True)
class TreeFacts:
    """What graphs.json says a tree carries: its variant, the [compile] fallback it was baked with,
    whether dynamo-precompile's functions and an AOTInductor package are in it. The build writes it
    (the variant's Compiled.facts over these defaults); a variant's `next_in` reads it back."""

    variant: str = ""
    fallback: str = "dynamo-precompile"  # a tree baked before [compile] fallback existed carried it
    precompiled: bool = False
    aoti_package: bool = False

    @classmethod
    def read(cls, tree: Path) -> TreeFacts | None:
        """The facts of the tree's graphs.json; None when it is missing or not JSON."""
        try:
            document = json.loads((tree / GRAPHS_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(document, dict):
            return None
        known = {name: document[name] for name in asdict(cls()) if name in document}
        return cls(**known)

    @classmethod
    def of(cls, variant: str, fallback: str, compiled: Mapping[str, bool]) -> TreeFacts:
        """The facts of a tree just compiled: the variant's Compiled.facts over the defaults."""
        given: dict[str, Any] = {**asdict(cls(variant, fallback)), **compiled}
        return cls(**given)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class CompileJob:
    """Compile every shape of `tactics` into the graphs tree `out` (Inductor's cache folder, when
    the variant uses one, is out/inductor: the caller set TORCHINDUCTOR_CACHE_DIR there)."""

    model: Llama
    cache: KVCache
    mode: str  # [compile] mode
    tactics: Mapping[StepShape, Tactic]
    out: Path
    log: Log
    fallback: GraphsVariant | None = (
        None  # [compile] fallback: the variant this tree also carries, for a host where it does not load
    )
    workers: Workers | None = None  # shapes compiled side by side in processes (runtime.aoti_workers)
    parallel: Parallel | None = None


@dataclass(frozen=True)
class Compiled:
    """The warm steps a compile leaves, its seconds per shape, and what graphs.json records of it."""

    steps: CompiledSteps
    seconds: dict[StepShape, float]
    facts: dict[str, bool] = field(default_factory=dict)  # graphs.json's "precompiled", "aoti_package"


@dataclass(frozen=True)
class LoadJob:
    """Load the steps of `shapes` from the graphs tree `tree` (Inductor's cache activated under it)."""

    model: Llama
    cache: KVCache
    mode: str
    shapes: tuple[StepShape, ...]
    tree: Path
    log: Log
    parallel: Parallel | None = None


@dataclass(frozen=True)
class Loaded:
    """Steps that serve, with the seconds of each part of their load (the phase log shows them)."""

    steps: CompiledSteps
    parts: dict[str, float] = field(default_factory=dict)
    traced: bool = False  # Dynamo traced the shapes at load (from Inductor's cache): the first runs did it


@dataclass(frozen=True)
class NotLoaded:
    """This variant's graphs do not load here; why, in words the start logs."""

    reason: str


class GraphsVariant(ABC):
    """One graphs variant: how its tree is compiled, keyed and loaded, and what it falls to."""

    name: ClassVar[str]  # the recipe's [compile] variant
    needs_inductor: ClassVar[bool]  # the start imports Inductor (and runs its init) before `load`
    reads_in_place: ClassVar[bool]  # `load` only reads the tree: served from the store's; else a private copy
    fallbacks: ClassVar[tuple[str, ...]] = ()  # the [compile] fallback variants its tree may carry
    taking: ClassVar[str]  # how the start says it takes this variant after another's failed
    links_kernels: ClassVar[bool] = False  # its compile links prebake's own CPU kernels (runtime.dot)

    def key_factors(self, options: CompileOptions) -> dict[str, object]:
        """What this variant adds to the graphs key, beside the [compile] options every variant keys on."""
        return {}

    def refuses(self, target: Target) -> str | None:
        """Why this variant cannot build or serve `target`, or None."""
        return None

    def compiles_without_weights(self, fallback: str) -> bool:
        """Whether `compile` (with this [compile] fallback) never runs the model nor keeps its weights:
        the bake then compiles on placeholders (prebake.engine.bundled.runtime.loader.placeholder_model)."""
        return False

    @abstractmethod
    def compile(self, job: CompileJob) -> Compiled: ...

    @abstractmethod
    def load(self, job: LoadJob) -> Loaded | NotLoaded: ...

    @abstractmethod
    def next_in(self, tree: Path) -> str | None:
        """The variant the graphs tree `tree` falls to when this one does not load; None: compile in place."""


def traced_on_one_rank(name: str, tp: int) -> str | None:
    """Why a variant whose tree holds Dynamo's guards and Inductor's graphs as traced on one rank
    refuses a tp > 1 target: never verified to load on another rank (vLLM keeps one such cache per
    rank, vllm#53958); the aoti-package's one package serves every rank, its weights bound at load."""
    if tp == 1:
        return None
    return (
        f"graphs variant {name!r} does not serve at tp {tp}: only 'aoti-package' without a fallback "
        f"does (one package for every rank, its weights bound at load); set [compile] variant = "
        f"'aoti-package' and no fallback, or bake tp 1"
    )
