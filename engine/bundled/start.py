"""The bundled engine's start: the shared starter (prebake.engine.common.starter: probe, keys,
lookup, verify, fetch, the miss policy) with a runner that builds, warms up and serves in this process,
its steps one call each in `_InProcess.run`: build (kinds that missed, by the bake's builders), torch
(imported on a thread since keys), install (warm_up.read_schedule; the graphs tree read in place, or
a private writable copy), load (build.model_and_cache, beside Inductor's init), warm-up (WarmUp.steps:
the variants' chain) or compile (build.compile_graphs, on a graphs miss), write-back
(engine/common/write_back.py's policy).

Every step logs one line with its duration and sets prebake_startup_step_seconds. The store's
trees are only read; the private run folder under $PREBAKE_HOME/tmp/ goes with Engine.close().
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prebake.artifacts.buckets.artifact import BucketSet
from prebake.artifacts.recipe.kinds import Builder, BuildRequest, TargetKeys
from prebake.artifacts.recipe.schema import Recipe
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.stats import record_fallback
from prebake.engine.bundled import cache_layout
from prebake.engine.bundled.cache_layout import FALLBACK_KIND
from prebake.engine.bundled.ranks import RankContext, check_ranks
from prebake.engine.bundled.runtime import openmp
from prebake.engine.bundled.runtime.metrics import Metrics
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.torch_import import Imports
from prebake.engine.bundled.variants import variant_of
from prebake.engine.bundled.warm_up import GraphsTree, WarmUp, begin_imports, read_schedule
from prebake.engine.common import starter
from prebake.engine.common.adapter import OpenServices, Services, StartRequest
from prebake.engine.common.write_back import WrittenBack, answers_now, write_back

if TYPE_CHECKING:  # torch is imported once the environment is set (install step), not before
    from prebake.engine.bundled.runtime.parallel import Parallel
    from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic

Emit = Callable[[str], None]
_runs = itertools.count()
_RESTORED = ("snapshot",)  # restored before a start (prebake.engine.bundled.snapshot.serving), never started from


@dataclass
class Engine:
    """A started engine: warm steps over the recipe's buckets, and the folder it runs in."""

    plan: TargetKeys
    steps: CompiledSteps
    buckets: BucketSet
    tactics: dict[StepShape, Tactic]
    run_dir: Path
    store: Store  # owns run_dir (a store scratch folder) for as long as the engine lives
    built: tuple[str, ...] = ()  # kinds compiled in place
    leases: ExitStack = field(default_factory=ExitStack)  # holds the store trees it was started from
    parallel: Parallel | None = None  # this process's rank of a tp > 1 group (engine/bundled/ranks.py)

    @property
    def recipe(self) -> Recipe:
        return self.plan.recipe

    def close(self, *, keep_run_dir: bool = False) -> None:
        if self.parallel is not None and self.parallel.rank == 0 and hasattr(self.steps, "close"):
            try:  # the followers stop with rank 0 (those still there)
                self.steps.close()
            except RuntimeError:
                pass
        self.leases.close()
        if not keep_run_dir:  # a restored snapshot's: shared by its image's restores, swept once none holds it
            shutil.rmtree(self.run_dir, ignore_errors=True)


@dataclass
class _Step:
    detail: str = ""


@dataclass
class StartupPhaseLog:
    """One line per step with its duration, mirrored into the metrics."""

    metrics: Metrics
    emit: Emit
    progress: Callable[[str], None] | None = None  # told each step's name as it begins
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str):
        if self.progress is not None:
            self.progress(name)
        record = _Step()
        started = time.perf_counter()
        yield record
        took = time.perf_counter() - started
        self.seconds[name] = took
        self.metrics.set("prebake_startup_step_seconds", round(took, 6), step=name)
        self.emit(f"prebake serve: {name}: {record.detail} ({took:.2f} s)")

    def note(self, text: str) -> None:
        for line in text.splitlines():
            self.emit(f"prebake serve:   {line}")


def start(
    request: StartRequest,
    metrics: Metrics,
    emit: Emit,
    open_services: OpenServices,
    *,
    eager: bool = False,
    progress: Callable[[str], None] | None = None,
    rank: RankContext | None = None,
) -> Engine:
    """Start what `request` asks (`eager`: compilation off, the engine's --eager); the warm engine.
    Raises MissRefused under --on-miss fail. `open_services` opens the store, registry and host
    probe (timed as the probe step); `rank`: this process is one rank of `prebake serve --tp N` (it
    joins the group once torch is in)."""
    with _short_switch_interval():
        log = StartupPhaseLog(metrics, emit, progress)
        return starter.start(_InProcess(request, eager, log, rank=rank), request, open_services, log)


# Start-up runs the import thread (pure Python, holding the GIL) beside steps that make thousands
# of short system calls (registry reads, the unpack's writes and fsyncs, the graphs tree's copy,
# the weights' allocations): each call gives the GIL up and then waits up to the switch interval
# (5 ms by default) to get it back from the import thread. A 0.5 ms interval for the start-up
# alone lets those steps run between the imports' slices (measured: docs/graphs-variants.md); it is
# put back once the engine is warm, so serving runs under Python's default.
_START_SWITCH_INTERVAL_S = 0.0005


@contextmanager
def _short_switch_interval():
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, _START_SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@dataclass
class _InProcess:
    """The bundled engine's runner (prebake.engine.common.starter.Runner): once the shared starter
    resolved the bundles, it builds what missed, warms up or compiles, and writes back, in this process."""

    request: StartRequest
    eager: bool
    log: StartupPhaseLog
    leases: ExitStack = field(default_factory=ExitStack)  # the store trees it starts from
    torch_import: Imports | None = None
    rank: RankContext | None = None

    def begin(self, plan: TargetKeys, services: Services) -> starter.Begun:
        """The kinds to resolve (eager: no graphs), a scratch run folder, torch's imports begun."""
        kinds = tuple(k for k in plan.kinds.names if not (self.eager and k == FALLBACK_KIND) and k not in _RESTORED)
        run_dir = services.store.scratch(f"serve-{os.getpid()}-{next(_runs)}")
        self.leases.callback(cache_layout.private_temp(run_dir))  # undone as the engine closes
        self.torch_import = begin_imports(self.eager, plan.recipe, run_dir)  # beside the lookup, fetch and load

        def abandon() -> None:
            self.leases.close()
            shutil.rmtree(run_dir, ignore_errors=True)

        return starter.Begun(kinds, run_dir, self.leases, abandon)

    def run(self, started: starter.Started) -> Engine:
        """build -> torch -> install -> load -> warm-up, else compile -> write-back: one call each."""
        plan, log, resolution = started.plan, self.log, started.resolution
        check_ranks(plan, self.eager, self.rank)
        _count(log.metrics, started)
        trees = _build(started, log)  # the kinds that missed, by the bake's builders (not the graphs)
        built = [m.key.kind for m in resolution.misses]
        parallel = self._torch()
        warm = _warm_up_of(started, parallel, log)
        buckets, schedule = self._install(plan, trees, warm)
        model, cache = _load(plan, parallel, schedule, log)
        steps = self._warm_up(warm, plan.recipe, model, cache, schedule, parallel)
        if warm.tree.path is not None:
            trees[FALLBACK_KIND] = warm.tree.path
        if steps is None:  # the graphs missed, or no variant of their tree loads here
            if FALLBACK_KIND not in built and FALLBACK_KIND not in resolution.installed:  # a hit compiled
                built.append(FALLBACK_KIND)  # again here is not written back
            steps = _compile(warm, plan.recipe, model, cache, schedule, log)
            trees[FALLBACK_KIND] = warm.tree.writable()
        store, run_dir = started.services.store, started.run_dir
        engine = Engine(plan, steps, buckets, schedule, run_dir, store, tuple(built), parallel=parallel)
        if self.request.write_back and built and (self.rank is None or self.rank.rank == 0):  # one rank's: all's
            _write_back(started, built, trees, log)
        engine.leases = self.leases
        return engine

    def _torch(self) -> Parallel | None:
        """torch's imports joined (begun on a thread as start-up began), and this rank's group joined."""
        assert self.torch_import is not None  # begun by `begin`
        with self.log.step("torch") as s:  # once per process
            s.detail = self.torch_import.join_torch()
            if self.rank is None:
                return None
            from prebake.engine.bundled.runtime.lockstep import join

            rank = self.rank
            s.detail += f"; rank {rank.rank} of a tp {rank.world} group (gloo, 127.0.0.1:{rank.port})"
            return join(rank.rank, rank.world, rank.port)

    def _install(
        self, plan: TargetKeys, trees: dict[str, Path], warm: WarmUp
    ) -> tuple[BucketSet, dict[StepShape, Tactic]]:
        """The step shapes and their tactics, the graphs tree placed; Inductor's init begun (on a
        thread, beside the weights' load) when the first variant needs it."""
        first = variant_of(plan.recipe)
        with self.log.step("install") as s:
            buckets, schedule = read_schedule(trees, plan.recipe.serving.max_model_len)
            if self.eager:
                s.detail = f"{len(schedule)} step shapes, compilation off"
            elif first.reads_in_place and warm.tree.installed is not None:  # copied only if it falls to one that writes
                s.detail = (
                    f"{len(schedule)} step shapes, graphs ({first.name}) read in place from {warm.tree.in_place()}"
                )
            else:
                s.detail = f"{len(schedule)} step shapes, graphs ({first.name}) in {warm.tree.writable()}"
            if not self.eager and first.needs_inductor:
                assert self.torch_import is not None
                warm.begin_inductor(self.torch_import)
        return buckets, schedule

    def _warm_up(self, warm: WarmUp, recipe: Recipe, model, cache, schedule, parallel) -> CompiledSteps | None:
        """The warm steps from the bundle (eager: without one); None when its tree loads nowhere here."""
        if not self.eager and warm.tree.installed is None:
            return None
        with self.log.step("warm-up") as s:
            first = None if self.eager else variant_of(recipe).name
            steps, s.detail = warm.steps(first, recipe, model, cache, schedule, parallel)
        return steps


def _build(started: starter.Started, log: StartupPhaseLog) -> dict[str, Path]:
    """Every kind's tree: installed, else (but the graphs, compiled later) built in place now."""
    plan, store, run_dir = started.plan, started.services.store, started.run_dir
    trees = {k: i.tree for k, i in started.installed.items()}
    if missing := [k for k in plan.kinds.names if k not in trees and k != FALLBACK_KIND and k not in _RESTORED]:
        with log.step("build") as s:
            for kind in missing:
                began = time.perf_counter()
                trees[kind] = _build_in_place(plan, kind, trees, run_dir)
                log.metrics.add("prebake_fallback_compiles_total", kind=kind)
                record_fallback(store, kind, time.perf_counter() - began)
            s.detail = f"built {', '.join(missing)} in place with the bake's builders"
    return trees


def _warm_up_of(started: starter.Started, parallel: Parallel | None, log: StartupPhaseLog) -> WarmUp:
    """The warm-up over the graphs tree (the store's, or a private copy); at tp > 1 the ranks agree
    after each variant's load, and one rank counts in the store's stats."""
    from prebake.engine.bundled.runtime.lockstep import agreement

    store = started.services.store if parallel is None or parallel.rank == 0 else None
    tree = GraphsTree(started.installed.get(FALLBACK_KIND), started.run_dir)
    return WarmUp(log, tree, store, started.plan.target, agree=agreement(parallel, log.note))


def _load(plan: TargetKeys, parallel: Parallel | None, schedule: dict, log: StartupPhaseLog):
    """The weights and the KV cache (this rank's shard); the ranks agree on rank 0's schedule."""
    from prebake.engine.bundled.build import model_and_cache
    from prebake.engine.bundled.runtime.lockstep import agree_on_schedule

    recipe = plan.recipe
    with log.step("load") as s:
        model, cache = model_and_cache(recipe, plan.target.dtype, plan.target.platform, parallel, log=log.note)
        import torch

        s.detail = (
            f"{recipe.model.name} {plan.target.dtype} ({sum(p.numel() for p in model.parameters()):,} parameters"
            + (f" on rank {parallel.rank} of {parallel.world}); " if parallel is not None else "); ")
            + f"{torch.get_num_threads()} threads, this host's; "  # kernels read it when they run, never the builder's
            + openmp.waits()
        )
        agree_on_schedule(parallel, schedule, log.note)
    return model, cache


def _compile(warm: WarmUp, recipe: Recipe, model, cache, schedule: dict, log: StartupPhaseLog) -> CompiledSteps:
    """Every step shape compiled in place into the private graphs tree (a graphs miss, or no variant loads)."""
    from prebake.engine.bundled.build import compile_graphs

    with log.step("compile") as s:
        if warm.init is not None:
            warm.init.join()
        steps = compile_graphs(model, cache, recipe, schedule, warm.tree.writable(), log=log.note)
        log.metrics.add("prebake_fallback_compiles_total", kind=FALLBACK_KIND)
        s.detail = f"{len(schedule)} step shapes compiled in place ({variant_of(recipe).name})"
    if warm.store is not None:
        record_fallback(warm.store, FALLBACK_KIND, log.seconds.get("compile"))
    return steps


def _count(metrics: Metrics, started: starter.Started) -> None:
    for kind, source in started.resolution.sources.items():
        metrics.add("prebake_bundle_hits_total", kind=kind, source=source)
    for miss in started.misses:
        metrics.add("prebake_bundle_misses_total", kind=miss.key.kind)


def _build_in_place(plan: TargetKeys, kind: str, trees: dict[str, Path], run_dir: Path) -> Path:
    out = run_dir / "built" / kind
    out.mkdir(parents=True)
    declared = plan.kinds[kind]
    declared.build(BuildRequest(plan, kind, out, {k: trees[k] for k in declared.upstream}))
    return out


def _write_back(started: starter.Started, built: list[str], trees: dict[str, Path], log: StartupPhaseLog) -> None:
    """The write-back step: pack and publish what was built in place (prebake.engine.common.write_back's
    one policy), unless the registry answered neither at start-up nor now."""

    def report(result: WrittenBack) -> None:
        log.metrics.add("prebake_write_backs_total", kind=result.kind, outcome=result.outcome)
        log.note(f"write-back {result.kind} {result.key[:12]}: {result.note}")
        if not result.published:
            log.emit(
                f"prebake serve: WARNING: write-back of {result.kind} failed; the next start will compile it again"
            )

    with log.step("write-back") as s:
        box = started.request.registry_timeout
        if not started.resolution.answered and not answers_now(started.plan, built[:1], started.services, box):
            address = started.services.source.address
            s.detail = (
                f"skipped: registry {address} did not answer at start-up, nor after the compile; "
                "the next start compiles again"
            )
            return
        builds: dict[str, Builder | None] = {kind: _copy_of(trees[kind]) for kind in built}
        box = started.request.fetch_timeout
        results = write_back(
            started.plan, builds, started.services, installed=started.installed, timeout=box, report=report
        )
        s.detail = ", ".join(f"{r.kind}: {r.outcome}" for r in results) or "nothing finished"


def _copy_of(tree: Path):
    def build(request: BuildRequest) -> None:
        shutil.copytree(tree, request.out, dirs_exist_ok=True)

    return build
