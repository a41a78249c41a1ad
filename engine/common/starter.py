"""The one start of an engine that runs as its own process: resolve, mounted trees, run folder,
miss policy, write-back and exec, the same for every such engine; the adapter gives only what
differs (the anchor is vLLM's CompilerInterface: the framework owns the cache, the backend the
compile), as an `EngineProcess`:

    prepare(request, services)            the target (--engine checked against the recipe), its
                                          bundles (fetched, or mounted and checked in place), a
                                          private run folder and the adapter's serve_environment
    fetched(prepared, launch)             what `prebake fetch --engine NAME` prints
    serve(prepared, launch, ...)          --on-miss fail, a fallback recorded, then exec; with
                                          --write-back and a miss, the engine watched until ready
                                          and what it compiled published by the one write-back policy

The adapter's `Launch` gives the command line, its variables and working folder; its
`EngineProcess` says when a started process serves (`ready`) and fills a bundle tree from the run
folder for write-back (`capture`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.recipe.kinds import Builder, TargetKeys
from prebake.artifacts.store.local import Installed
from prebake.artifacts.store.stats import record_fallback
from prebake.engine.common import write_back as publishing
from prebake.engine.common.adapter import (
    EngineStartError,
    Fetched,
    Services,
    StartRequest,
    plan_to_start,
)
from prebake.engine.common.advice import miss_advice, miss_exit_code
from prebake.engine.common.mounted import resolve_with_mounts

Emit = Callable[[str], None]


@dataclass(frozen=True)
class Prepared:
    """A target's bundles on this host and the private run folder its engine starts from."""

    plan: TargetKeys
    installed: dict[str, Installed]
    misses: tuple[Miss, ...]
    notes: tuple[str, ...]
    run_dir: Path
    variables: dict[str, str]  # the adapter's serve_environment


@dataclass(frozen=True)
class Launch:
    """How the engine's process starts: its command line, the variables added, its folder."""

    argv: tuple[str, ...]
    variables: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    notes: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()  # inherited variables the engine must not see


class EngineProcess(Protocol):
    """What differs between engines started as their own process (their adapter, or a part of it)."""

    name: str
    fallback_kind: str

    def ready(self, proc: subprocess.Popen, log: Path, started: float, launch: Launch) -> float:
        """Wait until the process started at `started` (time.monotonic(), its output in `log`) serves;
        the seconds it took (EngineStartError if it never does)."""
        ...

    def capture(self, prepared: Prepared, launch: Launch, ready_s: float) -> Builder:
        """Fill a bundle tree of the fallback kind from what the engine compiled into the run folder."""
        ...


def prepare(request: StartRequest, services: Services, run_dir: Path | None = None) -> Prepared:
    """The target, its bundles (the trees held for the command's life: Context.holds) and a run
    folder (default: $PREBAKE_HOME/engines/<engine>/<time>-<pid>) laid out by its adapter."""
    plan = plan_to_start(request, services)
    resolution = resolve_with_mounts(plan, request, services)
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir = run_dir or services.store.home / "engines" / request.engine / stamp
    variables = services.adapter(plan).serve_environment(plan, resolution.installed, run_dir)
    return Prepared(plan, resolution.installed, resolution.misses, resolution.notes, run_dir, variables)


def fetched(prepared: Prepared, launch: Launch) -> Fetched:
    """`prebake fetch --engine NAME`: the variables and the command line that start the engine."""
    return Fetched(
        prepared.plan.target.name,
        prepared.variables | launch.variables,
        prepared.installed,
        prepared.misses,
        prepared.notes + launch.notes,
        launch.argv,
        launch.cwd,
    )


def child_environment(launch: Launch, prepared: Prepared, base: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in base.items() if k not in launch.unset} | prepared.variables | launch.variables


def serve(
    engine: EngineProcess, prepared: Prepared, launch: Launch, request: StartRequest, services: Services, emit: Emit
) -> int:
    """Start the engine: its exit status (exec'd: its own), or 2/3/4 on a miss under --on-miss fail."""
    plan = prepared.plan
    for line in [m.explain() for m in prepared.misses] + list(prepared.notes + launch.notes):
        emit(f"prebake: {line}")
    if prepared.misses and request.on_miss == "fail":
        bake = f"doit bake model={plan.target.recipe} precision={plan.target.dtype}"
        advice = miss_advice(prepared.misses, target=plan.target.name, bake=bake, address=services.address)
        emit(f"prebake: no complete bundle set for {plan.target.name} in {services.address}; not starting "
             f"(--on-miss fail); {advice}")  # fmt: skip
        return miss_exit_code(prepared.misses)
    compiled = engine.fallback_kind
    if compiled not in prepared.installed:
        record_fallback(services.store, compiled)  # the engine compiles it as it starts
    env = child_environment(launch, prepared, os.environ)
    if not (request.write_back and compiled not in prepared.installed):
        if launch.cwd is not None:
            os.chdir(launch.cwd)
        os.execvpe(launch.argv[0], list(launch.argv), env)
    return _serve_and_write_back(engine, prepared, launch, env, services, emit, timeout=request.fetch_timeout)


def _serve_and_write_back(
    engine: EngineProcess,
    prepared: Prepared,
    launch: Launch,
    env: dict[str, str],
    services: Services,
    emit: Emit,
    *,
    timeout: float,
) -> int:
    prepared.run_dir.mkdir(parents=True, exist_ok=True)
    log = prepared.run_dir / f"{engine.name}.log"
    started = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(launch.argv),
            env=env,
            cwd=launch.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    emit(f"prebake: {engine.name}'s log: {log}")

    def forward(signum, _frame) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        seconds = engine.ready(proc, log, started, launch)
        emit(f"prebake: {engine.name} ready in {seconds:.1f} s; writing what it compiled back")
        for line in write_back(engine, prepared, launch, services, seconds, timeout=timeout):  # never raised
            emit(f"prebake: {line}")
        return proc.wait()
    except EngineStartError as exc:
        emit(f"prebake: {exc}")
        _stop(proc)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def write_back(
    engine: EngineProcess, prepared: Prepared, launch: Launch, services: Services, ready_s: float, *, timeout: float
) -> list[str]:
    """Publish every kind that missed (the one write-back policy, prebake.engine.common.write_back):
    the fallback kind from the engine's run folder, the others with the bake's builders."""
    compiled = engine.fallback_kind
    capture = engine.capture(prepared, launch, ready_s)
    builds: dict[str, Builder | None] = {
        kind: capture if kind == compiled else None
        for kind in prepared.plan.kinds.names
        if kind not in prepared.installed
    }
    results = publishing.write_back(prepared.plan, builds, services, installed=prepared.installed, timeout=timeout)
    return [f"{r.kind}: {r.note}, key {r.key[:16]}" for r in results]


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


__all__ = ["EngineProcess", "Launch", "Prepared", "fetched", "prepare", "serve", "write_back"]
