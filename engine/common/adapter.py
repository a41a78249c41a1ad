"""The engine seam: what an engine declares, what differs in its start, and what it is given.

    EngineSpec      the declaration, as data: name, kinds, fallback kind, graphs variants,
                    packages (software factors), [engine] settings model, start options (EngineOption:
                    flag, help, type, default; the CLI's flags are built from them)
    EngineAdapter   spec + serve_environment, fetch, serve (what differs; the shared starter,
                    prebake.engine.common.starter, does resolve, mounts, misses and write-back)
    StartRequest    what `prebake fetch|serve` asked; Services: the composition root's parts
                    (store, host, source, publishing, holds, pick_plan), never the root itself

Adapters are registered in prebake.engine.adapters (one line); plan_to_start is the one check that
`--engine` and the recipe's engine agree. May import artifacts/ and registry/review, no engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import ValidationError

from prebake.artifacts.errors import PrebakeError, RecipeError
from prebake.artifacts.fetch.gate import WRITE_BACK_LABEL
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import FETCH_TIMEOUT_S, REGISTRY_TIMEOUT_S, Source
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.ports.registry import Registry, TrustCheck
from prebake.artifacts.recipe.kinds import Kind, TargetKeys
from prebake.artifacts.recipe.schema import Recipe, Target
from prebake.artifacts.store.local import Installed, Store
from prebake.engine.common.probe import Host, Package

if TYPE_CHECKING:  # the bake's and write-back's modules: loaded by what bakes or writes back, not by a start
    from prebake.artifacts.bake.bake_kind import Signer
    from prebake.artifacts.bake.provenance import Attest
    from prebake.registry.review.writeback import WriteBackTarget


class EngineStartError(PrebakeError, RuntimeError):
    """An engine started by an adapter exited, or did not become ready in time."""


@dataclass(frozen=True)
class StartRequest:
    """What `prebake fetch` or `prebake serve` asked of an engine, whichever engine it is."""

    model: str
    precision: str | None = None
    tp: int | None = None
    registry_timeout: float = REGISTRY_TIMEOUT_S["fetch"]  # then the engine starts without bundles
    fetch_timeout: float = FETCH_TIMEOUT_S
    on_miss: Literal["compile", "fail"] = "compile"
    write_back: bool = False
    host: str | None = None
    port: int | None = None
    mounted: tuple[str, ...] = ()  # KIND=PATH: bundle trees already mounted read-only (artifacts/fetch/mounted.py)
    engine: str = "prebake"  # --engine: the engine asked for; the recipe's must be the same (`plan_to_start`)
    options: Mapping[str, object] = field(default_factory=dict)  # engine-only options, given ones only


REST = "engine_args"  # the option of the arguments after `--`, handed to the engine as they are


@dataclass(frozen=True)
class EngineOption:
    """One start option of an engine, declared once: the CLI builds its flag from it (vLLM's
    wording), `prebake serve --help` shows `help`, the engine reads it parsed (`options_from`)."""

    flag: str  # "--eager"; "--" for the arguments after -- (REST)
    help: str
    type: Callable[[str], object] = (
        str  # bool: a switch; tuple: the arguments after --; else argparse's type (str, Path, float, a checking function)
    )
    default: object = None  # when not given
    commands: tuple[str, ...] = ("serve",)  # the `prebake` commands that take it

    @property
    def name(self) -> str:
        """Its key in StartRequest.options and the parsed options: the flag in snake case."""
        return self.flag.removeprefix("--").replace("-", "_") or REST


def option_flag(name: str) -> str:
    """How the command line gives option `name`, for messages."""
    return "flags after --" if name == REST else "--" + name.replace("_", "-")


def options_from(options: Sequence[EngineOption], request: StartRequest, engine: str) -> Mapping[str, object]:
    """`request`'s options as an engine declaring `options` reads them, every one (its default when not
    given); a PrebakeError names the given ones it does not take, with what it takes."""
    declared = {option.name: option for option in options}
    if refused := sorted(set(request.options) - set(declared)):
        offered = ", ".join(sorted(option_flag(name) for name in declared)) or "none"
        flags = ", ".join(option_flag(name) for name in refused)
        raise PrebakeError(f"{flags}: not an option of engine {engine!r} (its options: {offered})")
    return MappingProxyType({name: request.options.get(name, o.default) for name, o in declared.items()})


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

    def to_json(self, advice: str | None = None) -> dict:
        """`fetch --json`: the target, whether every kind was installed, the misses, the environment,
        the installed bundles, an engine process's command line where there is one, and `advice`
        (what to bake) where something missed."""
        payload: dict = {
            "target": self.target,
            "complete": not self.misses,
            "misses": [m.to_json() for m in self.misses],
            "env": self.env,
            "bundles": {
                k: {"key": i.manifest.key_digest, "blob": i.manifest.blob.digest, "tree": str(i.tree)}
                for k, i in self.installed.items()
            },
        }
        if self.argv:
            payload |= {"argv": list(self.argv), "cwd": str(self.cwd) if self.cwd else None}
        return payload | ({"advice": advice} if advice else {})


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is, as data the core reads (it never asks an engine's name)."""

    name: str  # the recipe's [model] engine and `--engine NAME`
    kinds: tuple[Kind, ...]  # what it compiles, in build order, after the shared buckets kind
    fallback_kind: str  # the kind it compiles by itself when it starts on a miss
    variants: Mapping[str, tuple[str, ...]]  # its graphs variants, the default first: each with its trees' fallbacks
    packages: tuple[Package, ...] = ()  # its software factors (joined to its kinds' keys)
    settings: type[Frozen] | None = None  # its recipe's [engine] table (None: it takes none)
    options: tuple[EngineOption, ...] = ()  # its start options, each declared once (the CLI's flags)
    # why it cannot build or serve a target of a recipe (its variant at that tp, say), or None: the
    # fleet plan marks such a target unbuildable, with this reason, instead of "here: yes"
    refuses: Callable[[Recipe, Target], str | None] = lambda recipe, target: None
    # kinds a recipe asks for beyond `kinds` for a target (the bundled engine's snapshot under [snapshot]
    # bake = true, at tp 1); a start resolves them itself, before or instead of the others
    optional_kinds: Callable[[Recipe, Target], tuple[Kind, ...]] = lambda recipe, target: ()

    @property
    def default_variant(self) -> str:
        """[compile] variant when the recipe names none."""
        return next(iter(self.variants))

    def graphs_variant(self, recipe: Recipe) -> str:
        """The graphs variant `recipe` asks of this engine (RecipeError naming the variants it serves)."""
        try:
            return recipe.compile.served_variant(self.variants)
        except ValueError as exc:
            raise RecipeError(f"recipe {recipe.model.name}: engine {self.name!r}: {exc}") from None

    def read_settings(self, recipe: Recipe) -> Frozen | None:
        """The recipe's [engine] settings, validated (RecipeError naming the field and the fix)."""
        return recipe_settings(recipe, self.name, self.settings)

    def options_of(self, request: StartRequest) -> Mapping[str, object]:
        """`request`'s options as this engine reads them: every one it declares, parsed (options_from)."""
        return options_from(self.options, request, self.name)


class EngineAdapter(Protocol):
    """One serving engine: its declaration, and what differs in how it starts.

    A new engine is one folder under engine/ with a class of this shape, and one
    `register(adapter)` line in prebake.engine.adapters; the CLI, the fleet planner, the probe
    and the bake know it from there. Both commands run through the shared starter
    (prebake.engine.common.starter), which does everything the engines share.
    """

    @property
    def spec(self) -> EngineSpec: ...

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
    """What an engine's start needs from the composition root, opened once per command
    (prebake.engine.compose.Context is one). Engines take it as a parameter and never open one
    themselves: the composition root sits above every engine."""

    @property
    def store(self) -> Store: ...
    @property
    def host(self) -> Host: ...
    @property
    def source(self) -> Source: ...
    @property
    def publishing(self) -> Publishing: ...
    @property
    def holds(self) -> ExitStack:
        """The trees this command uses, held (from gc) for the command's life."""
        ...

    def pick_plan(self, recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> TargetKeys: ...


OpenServices = Callable[[], Services]  # opens the Services of one command, when the start is ready for them
