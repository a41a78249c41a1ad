"""The one start of every engine (the anchor is vLLM's CompilerInterface: the framework owns the
cache, the backend the compile). The starter does what engines share:

    start(runner, ...)   probe, keys, the fetch pipeline (prebake.artifacts.fetch.pipeline.resolve:
                         lookup, verify, fetch, one step each), the miss policy (MissRefused), runner.run
    prepare(...)         the fetch of an engine that is its own process: its bundles and run folder
    Process              the runner of an engine that is its own process: its run folder and
                         environment, the fallback record, then exec, or (--write-back on a miss)
                         watch it until ready and publish what it compiled (write_back.py's policy)

What differs is the adapter's: an `EngineProcess` (launch, ready, capture), or a runner of its
own (the bundled engine runs in this process: prebake.engine.bundled.start).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from prebake.artifacts.errors import ExitCode, PrebakeError
from prebake.artifacts.fetch.mounted import parse_mounts
from prebake.artifacts.fetch.outcome import Miss, Resolution
from prebake.artifacts.fetch.pipeline import Quiet, Steps, resolve
from prebake.artifacts.recipe.kinds import Builder, TargetKeys
from prebake.artifacts.store.local import Installed
from prebake.artifacts.store.stats import record_fallback
from prebake.engine.common.adapter import (
    EngineAdapter,
    EngineStartError,
    Fetched,
    OpenServices,
    Services,
    StartRequest,
    plan_to_start,
)
from prebake.engine.common.advice import bake_command, miss_advice, miss_exit_code

Emit = Callable[[str], None]
T = TypeVar("T", covariant=True)


class MissRefused(PrebakeError, LookupError):
    """Bundles missed and the engine was told --on-miss fail; `code` says why (3 nothing matches,
    4 the registry could not be asked, 2 something was refused)."""

    def __init__(self, message: str, code: int = ExitCode.MISS):
        super().__init__(message)
        self.code = code


class StepLog(Steps, Protocol):
    """The start's steps (each timed, with a detail) and its notes."""

    def note(self, text: str) -> None: ...


@dataclass(frozen=True)
class Lines(Quiet):
    """The log of an engine started as its own process: steps are quiet, notes are `prebake:` lines."""

    emit: Emit

    def note(self, text: str) -> None:
        for line in text.splitlines():
            self.emit(f"prebake: {line}")


def fetch_bundles(
    plan: TargetKeys,
    request: StartRequest,
    services: Services,
    *,
    kinds: Sequence[str] | None = None,
    log: StepLog | None = None,
    hold: ExitStack | None = None,
) -> Resolution:
    """The fetch pipeline (prebake.artifacts.fetch.pipeline.resolve) as `request` asks it: its time
    boxes, its mounted trees; every tree held on `hold` (default: the command's `services.holds`)."""
    return resolve(
        plan,
        store=services.store,
        source=services.source,
        kinds=kinds,
        lookup_timeout=request.registry_timeout,
        fetch_timeout=request.fetch_timeout,
        hold=services.holds if hold is None else hold,
        mounted=parse_mounts(request.mounted, plan.kinds.names),
        steps=log,
    )


def refuse_misses(plan: TargetKeys, resolution: Resolution, request: StartRequest, address: str) -> None:
    """The miss policy: under --on-miss fail, MissRefused saying what to do (its code: why)."""
    if not resolution.misses or request.on_miss != "fail":
        return
    bake = bake_command(plan.target.recipe, plan.target.dtype)
    raise MissRefused(
        f"{len(resolution.misses)} of {plan.target.name}'s bundles missed (above) and --on-miss is fail; "
        f"{miss_advice(resolution.misses, target=plan.target.name, bake=bake, address=address)}; "
        f"or use --on-miss compile",
        code=miss_exit_code(resolution.misses),
    )


@dataclass(frozen=True)
class Begun:
    """What a runner set up once the keys are known: the kinds to resolve, its run folder, where
    the trees it uses are held, and what undoes it when the start fails."""

    kinds: tuple[str, ...]
    run_dir: Path
    hold: ExitStack
    abandon: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class Started:
    """A start whose bundles are resolved and whose misses the policy accepted."""

    plan: TargetKeys
    resolution: Resolution
    run_dir: Path
    request: StartRequest
    services: Services
    log: StepLog

    @property
    def installed(self) -> dict[str, Installed]:
        return self.resolution.installed

    @property
    def misses(self) -> tuple[Miss, ...]:
        return tuple(self.resolution.misses)


class Runner(Protocol[T]):
    """Running the engine, once the starter resolved its bundles: exec'd or watched as its own
    process (`Process`), or in this process (the bundled engine)."""

    def begin(self, plan: TargetKeys, services: Services) -> Begun: ...
    def run(self, started: Started) -> T: ...


def start(runner: Runner[T], request: StartRequest, open_services: OpenServices, log: StepLog) -> T:
    """probe -> keys -> lookup -> verify -> fetch -> the miss policy -> runner.run; what it returns."""
    with log.step("probe") as s:
        services = open_services()
        s.detail = services.host.platform.describe()
    with log.step("keys") as s:
        plan = plan_to_start(request, services)
        begun = runner.begin(plan, services)
        s.detail = f"{plan.target.name} " + ", ".join(f"{k} {plan.key(k).digest[:12]}" for k in begun.kinds)
    try:
        resolution = fetch_bundles(plan, request, services, kinds=begun.kinds, log=log, hold=begun.hold)
        for line in resolution.notes:
            log.note(line)
        for miss in resolution.misses:
            log.note(miss.explain())
        refuse_misses(plan, resolution, request, services.source.address)
        return runner.run(Started(plan, resolution, begun.run_dir, request, services, log))
    except BaseException:
        begun.abandon()
        raise


# -- an engine that is its own process -------------------------------------------------------


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
    banner: str = ""  # what serve says as it starts the engine


class EngineProcess(Protocol):
    """What differs between engines started as their own process (their adapter, or a part of it)."""

    def launch(self, prepared: Prepared, request: StartRequest, services: Services) -> Launch:
        """The command line, variables and folder that start the engine from `prepared`."""
        ...

    def ready(self, proc: subprocess.Popen, log: Path, started: float, launch: Launch) -> float:
        """Wait until the process started at `started` (time.monotonic(), its output in `log`) serves;
        the seconds it took (EngineStartError if it never does)."""
        ...

    def capture(self, prepared: Prepared, launch: Launch, ready_s: float) -> Builder:
        """Fill a bundle tree of the fallback kind from what the engine compiled into the run folder."""
        ...


def run_folder(services: Services, engine: str, given: Path | None = None) -> Path:
    """The engine's private run folder: `given`, else $PREBAKE_HOME/engines/<engine>/<time>-<pid>."""
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return given or services.store.home / "engines" / engine / stamp


ServeEnvironment = Callable[[TargetKeys, Mapping[str, Installed], Path], dict[str, str]]  # EngineAdapter's


def _prepared(environment: ServeEnvironment, plan: TargetKeys, resolution: Resolution, run_dir: Path) -> Prepared:
    variables = environment(plan, resolution.installed, run_dir)
    return Prepared(plan, resolution.installed, tuple(resolution.misses), tuple(resolution.notes), run_dir, variables)


def prepare(
    environment: ServeEnvironment, request: StartRequest, services: Services, run_dir: Path | None = None
) -> Prepared:
    """The target, its bundles (held for the command's life: `services.holds`) and a run folder
    (`run_folder`) laid out by the engine's serve_environment, without starting anything (fetch)."""
    plan = plan_to_start(request, services)
    resolution = fetch_bundles(plan, request, services)
    return _prepared(environment, plan, resolution, run_folder(services, request.engine, run_dir))


def fetched(prepared: Prepared, launch: Launch) -> Fetched:
    """`prebake fetch --engine NAME`'s answer: the variables and the command line that start the engine."""
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


@dataclass(frozen=True)
class Process:
    """The runner of an engine that is its own process: exec'd (its signals and exit status are
    its own), or, with --write-back and a miss of its fallback kind, watched until it serves and
    what it compiled published."""

    adapter: EngineAdapter
    engine: EngineProcess
    emit: Emit
    run_dir: Path | None = None  # default: run_folder's

    def begin(self, plan: TargetKeys, services: Services) -> Begun:
        return Begun(plan.kinds.names, run_folder(services, self.adapter.spec.name, self.run_dir), services.holds)

    def run(self, started: Started) -> int:
        prepared = _prepared(self.adapter.serve_environment, started.plan, started.resolution, started.run_dir)
        launch = self.engine.launch(prepared, started.request, started.services)
        for line in launch.notes:
            started.log.note(line)
        if launch.banner:
            self.emit(f"prebake: {launch.banner}")
        compiled = self.adapter.spec.fallback_kind
        if compiled not in prepared.installed:
            record_fallback(started.services.store, compiled)  # the engine compiles it as it starts
        env = child_environment(launch, prepared, os.environ)
        if not (started.request.write_back and compiled not in prepared.installed):
            if launch.cwd is not None:
                os.chdir(launch.cwd)
            os.execvpe(launch.argv[0], list(launch.argv), env)
        return self._watch(prepared, launch, env, started)

    def _watch(self, prepared: Prepared, launch: Launch, env: dict[str, str], started: Started) -> int:
        name, emit = self.adapter.spec.name, self.emit
        prepared.run_dir.mkdir(parents=True, exist_ok=True)
        log = prepared.run_dir / f"{name}.log"
        began = time.monotonic()
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
        emit(f"prebake: {name}'s log: {log}")

        def forward(signum, _frame) -> None:
            proc.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            seconds = self.engine.ready(proc, log, began, launch)
            emit(f"prebake: {name} ready in {seconds:.1f} s; writing what it compiled back")
            timeout = started.request.fetch_timeout
            published = write_back(
                self.engine,
                self.adapter.spec.fallback_kind,
                prepared,
                launch,
                started.services,
                seconds,
                timeout=timeout,
            )
            for line in published:  # never raised
                emit(f"prebake: {line}")
            return proc.wait()
        except EngineStartError as exc:
            emit(f"prebake: {exc}")
            _stop(proc)
            return 1
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def serve(runner: Process, request: StartRequest, open_services: OpenServices) -> int:
    """`prebake serve --engine NAME` for an engine that is its own process: its exit status
    (exec'd: its own), or 2/3/4 on a miss under --on-miss fail."""
    try:
        return start(runner, request, open_services, Lines(runner.emit))
    except MissRefused as exc:
        runner.emit(f"prebake: {exc}")
        return exc.code


def write_back(
    engine: EngineProcess,
    compiled: str,
    prepared: Prepared,
    launch: Launch,
    services: Services,
    ready_s: float,
    *,
    timeout: float,
) -> list[str]:
    """Publish every kind that missed (the one write-back policy, prebake.engine.common.write_back):
    the `compiled` kind captured from the engine's run folder, the others with the bake's builders.
    Imported here, as the bake's modules are: a start that writes nothing back loads none of them."""
    from prebake.engine.common import write_back as publishing

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


__all__ = [
    "Begun",
    "EngineProcess",
    "Launch",
    "Lines",
    "MissRefused",
    "Prepared",
    "Process",
    "Runner",
    "Started",
    "fetch_bundles",
    "fetched",
    "prepare",
    "refuse_misses",
    "serve",
    "start",
    "write_back",
]
