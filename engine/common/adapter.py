"""The engine-adapter interface: what an engine needs from prebake, and what it gives back.

An adapter declares, for recipes it serves (`handles`):

    kinds()              the artifact kinds it compiles, after the shared buckets kind: what its
                         autotune and graphs artifacts are, how each is built and keyed
    fallback_kind        the kind the engine produces by itself when it starts on a miss
    serve_environment()  the variables that start the engine from installed trees
    fetch(), serve()     `prebake fetch|serve --engine NAME`: install, then print how to start, or
                         start and serve; a write-back follows the one policy of
                         prebake.engine.common.write_back

Its key factors are its kinds' key groups (Kind.groups); the software versions only that engine
keys on are named in prebake.artifacts.bake.kinds.ENGINE_ONLY_SOFTWARE. Adapters are looked up by
`prebake.engine.adapters.adapter_for(recipe, target)` (or `adapter_named` for --engine); nothing
else in the code asks which engine a recipe names. Engines are given a `Services` (the store,
registry, trust policy, signer and host), never the composition root itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from prebake.artifacts.bake.bake_kind import Signer
from prebake.artifacts.bake.fetch import Miss, Resolution, TrustCheck
from prebake.artifacts.bake.kinds import Kind, TargetKeys
from prebake.artifacts.bake.provenance import Attest
from prebake.artifacts.bake.recipes import Recipe, Target
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.ports.registry import Registry
from prebake.artifacts.store.local import Installed, Store
from prebake.engine.common.probe import Host
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
    eager: bool = False  # compilation off: the eager floor (an engine that cannot refuses)
    host: str | None = None
    port: int | None = None
    api_key: str | None = None
    cache_root: Path | None = None  # where a separate engine process keeps its writable caches
    engine_args: tuple[str, ...] = ()  # flags after `--`, for an engine started as its own process
    mounted: tuple[str, ...] = ()  # KIND=PATH: bundle trees already mounted read-only (engine/common/mounted.py)
    force_aot_load: bool = False  # vLLM's strict loading (VLLM_FORCE_AOT_LOAD=1); other engines refuse it


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

    A new engine is one folder under engine/ with a class of this shape, and one line in
    prebake.engine.adapters.ADAPTERS; the CLI, the fleet planner and the bake know it from there.
    """

    name: str  # the recipe's [model] engine
    fallback_kind: str

    def handles(self, recipe: Recipe, target: Target) -> bool:
        """Whether this adapter serves `recipe` on `target`."""
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


class Services(Protocol):
    """What an engine's start needs from the composition root: the store, the registry, the trust
    policy, the signer and the host, opened once per command (prebake.engine.compose.Context is one).

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
    def sign(self) -> Signer | None: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def attest(self) -> Attest | None: ...
    @property
    def write_back(self) -> WriteBackTarget: ...
    @property
    def write_back_registry(self) -> Registry: ...

    def write_back_plan(self, plan: TargetKeys) -> TargetKeys: ...

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
