"""The engine-adapter interface: what an engine needs from prebake, and what it gives back.

An adapter declares, as data, what the core must not know by name:

    name                 the recipe's [model] engine and `--engine NAME`
    packages             its software factors: the packages the host probe reads for it, whose
                         versions join its kinds' keys (software.<factor>) and its provenance
    default_variant      the graphs variant of its recipes when [compile] names none
    settings(recipe)     its recipe settings: the recipe's [engine] table, validated
    kinds()              the artifact kinds it compiles, after the shared buckets kind
    fallback_kind        the kind the engine produces by itself when it starts on a miss
    serve_environment()  the variables that start the engine from installed trees
    fetch(), serve()     `prebake fetch|serve --engine NAME`; the engine-only flags (--eager,
                         --cache-root, ...) reach it as StartRequest.options, which it checks
                         against those it takes (`request.engine_options`)

Adapters are registered in prebake.engine.adapters (`register(adapter)`, one line) and looked up
there; nothing else in the code asks which engine a recipe names. Engines are given a `Services`
(the store, registry, trust policy, signer and host), never the composition root itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from pydantic import ValidationError

from prebake.artifacts.bake.bake_kind import Signer
from prebake.artifacts.bake.provenance import Attest
from prebake.artifacts.errors import PrebakeError, RecipeError
from prebake.artifacts.fetch.gate import WRITE_BACK_LABEL
from prebake.artifacts.fetch.outcome import Miss, Resolution
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.ports.registry import Registry, TrustCheck
from prebake.artifacts.recipe.kinds import Kind, TargetKeys
from prebake.artifacts.recipe.schema import Recipe
from prebake.artifacts.store.local import Installed, Store
from prebake.engine.common.probe import Host, Package
from prebake.registry.review.writeback import WriteBackTarget


class EngineStartError(PrebakeError, RuntimeError):
    """An engine started by an adapter exited, or did not become ready in time."""


@dataclass(frozen=True)
class StartRequest:
    """What `prebake fetch` or `prebake serve` asked of an engine, whichever engine it is."""

    model: str
    precision: str | None = None
    tp: int | None = None
    registry: str | None = None
    registry_timeout: float = 30.0  # seconds the lookup may take (serve: 5); then the engine starts without bundles
    fetch_timeout: float = 600.0  # seconds downloads (and write-back) may take
    on_miss: Literal["compile", "fail"] = "compile"
    write_back: bool = False
    host: str | None = None
    port: int | None = None
    api_key: str | None = None
    mounted: tuple[str, ...] = ()  # KIND=PATH: bundle trees already mounted read-only (engine/common/mounted.py)
    engine: str = "prebake"  # --engine: the engine asked for; the recipe's must be the same (`plan_to_start`)
    options: Mapping[str, object] = field(default_factory=dict)  # engine-only options, given ones only

    def engine_options(self, takes: Mapping[str, str]) -> Mapping[str, object]:
        """The options, all of which the engine `takes` (option -> the flag that gives it); a
        PrebakeError names those it does not, with what it takes."""
        refused = sorted(set(self.options) - set(takes))
        if refused:
            flags = ", ".join(OPTION_FLAGS.get(o, o) for o in refused)
            offered = ", ".join(sorted(takes.values())) or "none"
            raise PrebakeError(f"{flags}: not an option of engine {self.engine!r} (its options: {offered})")
        return self.options


# The command line's flag of each engine-only option, for messages (engine/cli/serving.py sets them).
OPTION_FLAGS = {
    "eager": "--eager",
    "cache_root": "--cache-root",
    "engine_args": "flags after --",
    "force_aot_load": "--force-aot-load",
}


@dataclass(frozen=True)
class Fetched:
    """What `prebake fetch` prints: the variables that start the engine from installed trees,
    and, for an engine started as its own process, its command line."""

    target: str
    env: dict[str, str]
    installed: dict[str, Installed]
    misses: tuple[Miss, ...] = ()
    notes: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    cwd: Path | None = None


class EngineAdapter(Protocol):
    """One serving engine: its compiled artifacts and how it starts from them.

    A new engine is one folder under engine/ with a class of this shape, and one
    `register(adapter)` line in prebake.engine.adapters; the CLI, the fleet planner, the probe
    and the bake know it from there.
    """

    name: str  # the recipe's [model] engine

    @property
    def packages(self) -> Sequence[Package]:
        """Its software factors."""
        ...

    default_variant: str  # [compile] variant when the recipe names none
    fallback_kind: str

    def settings(self, recipe: Recipe) -> object:
        """The recipe's [engine] settings, validated (RecipeError naming the field and the fix)."""
        ...

    def kinds(self) -> tuple[Kind, ...]:
        """The kinds this engine compiles, in build order, after the shared buckets kind."""
        ...

    def serve_environment(self, plan: TargetKeys, installed: Mapping[str, Installed], run_dir: Path) -> dict[str, str]:
        """Variables that start the engine from the installed trees, with private writable copies
        under `run_dir` wherever the engine writes beside what it reads."""
        ...

    def fetch(self, request: StartRequest, services: Services) -> Fetched:
        """`prebake fetch --engine NAME`: install what matches and say how to start the engine."""
        ...

    def serve(self, request: StartRequest, open_services: OpenServices) -> int:
        """`prebake serve --engine NAME`: start and serve (write back on request); the exit status."""
        ...


def recipe_settings(recipe: Recipe, engine: str, model: type[Frozen] | None) -> Frozen | None:
    """The recipe's [engine] table read as `model` (None: the engine takes no settings)."""
    if model is None:
        if recipe.engine:
            raise RecipeError(
                f"recipe {recipe.model.name}: engine {engine!r} takes no [engine] settings, but the recipe gives "
                f"{', '.join(sorted(recipe.engine))}; remove the [engine] table"
            )
        return None
    try:
        return model.model_validate(recipe.engine)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise RecipeError(
            f"recipe {recipe.model.name}: [engine] settings for {engine!r}: {problems}; "
            f"the engine's adapter documents its settings"
        ) from None


def plan_to_start(request: StartRequest, services: Services) -> TargetKeys:
    """The target `fetch` or `serve` starts, and the one check that `--engine` and the recipe's
    engine agree (a RecipeError naming both and the fix)."""
    from prebake.artifacts.recipe.schema import load_recipe

    recipe = load_recipe(request.model)
    if recipe.model.engine != request.engine:
        raise RecipeError(
            f"recipe {recipe.model.name} is served by engine {recipe.model.engine!r}, not {request.engine!r}; "
            f"use --engine {recipe.model.engine}, or a recipe with engine = {request.engine!r}"
        )
    return services.pick_plan(recipe, dtype=request.precision, tp=request.tp)


@dataclass(frozen=True)
class Publishing:
    """Where and how an engine writes back what it compiled (prebake.engine.common.write_back):
    the target (quarantine by default), its registry, the signer and attester of a bake, and the
    trust policy that judges it (none for quarantine: `prebake promote` does)."""

    target: WriteBackTarget
    open_registry: Callable[[], Registry]
    sign: Signer | None
    attest: Attest | None
    trust: TrustCheck | None

    def plan(self, plan: TargetKeys) -> TargetKeys:
        """`plan` whose bundles say they await review, when write-back goes to quarantine."""
        if not self.target.quarantined:
            return plan
        return dataclasses.replace(plan, labels={**plan.labels, WRITE_BACK_LABEL: "quarantine"})


class Services(Protocol):
    """What an engine's start needs from the composition root: the store, the host, the registry
    and its trust policy, where write-backs go, the plans and the fetch, opened once per command
    (prebake.engine.compose.Context is one).

    Engines take it as a parameter and never open one themselves: the composition root sits above
    every engine, so an engine that imported it would close a circle."""

    @property
    def store(self) -> Store: ...
    @property
    def host(self) -> Host: ...
    @property
    def address(self) -> str: ...
    @property
    def trust(self) -> TrustCheck | None: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def publishing(self) -> Publishing: ...

    def pick_plan(self, recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> TargetKeys: ...

    def adapter(self, plan: TargetKeys) -> EngineAdapter: ...

    def resolve(
        self,
        plan: TargetKeys,
        *,
        lookup_timeout: float = 30.0,
        fetch_timeout: float = 600.0,
        kinds: Sequence[str] | None = None,
    ) -> Resolution: ...


OpenServices = Callable[[], Services]  # opens the Services of one command, when the start is ready for them
