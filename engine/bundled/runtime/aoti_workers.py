"""Step shapes AOT-compiled at once, each in a worker process, bounded by cores and memory.

Each shape's export and aot_compile is one g++ of one large C++ file: nothing inside a shape runs
in parallel, so a bake with one shape at a time leaves every core but one idle. Workers (spawned,
so none inherits a half-initialised torch) each build the model once from its source (the recipe's
[model], seeded random weights or the checkpoint) and compile the shapes handed to them; every .so
lands in the Inductor cache folder the parent set, and the parent packages them in the shapes'
order, so the package holds what the serial loop's holds (tests/integration/test_aoti_workers.py).
How many: the cores this process may run on, the cores of those it measures free (a worker's
start costs seconds a shape on a core that another process keeps busy does not repay), the shapes,
and the memory available over one worker's estimated peak (`per_worker_bytes`), the least of them.
A bar on stderr (tqdm, when installed) counts the shapes done; the log gets a line per shape.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.model import KVCache, Llama
from prebake.engine.bundled.runtime.openmp import FREE_SHARE
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import Tactic
from prebake.engine.common.cores import cores_got
from prebake.engine.common.cpu import usable_cores
from prebake.engine.common.logs import Countdown, quiet_dependency_deprecations

# One worker's peak beyond its model: torch, Inductor and export in a fresh process, and the
# compile of one shape (measured: docs/graphs-variants.md#bakes-that-use-every-core).
WORKER_BASE_BYTES = 1_300 << 20
MODEL_COPIES = 2  # the weights, and the exported program's view of them while Inductor lowers it


@dataclass(frozen=True)
class ModelSource:
    """What a worker builds its model and KV cache from (the parent's, rebuilt the same way)."""

    spec: ModelSpec
    dtype: str
    max_num_seqs: int
    max_model_len: int
    placeholders: bool = False  # the parent compiles on placeholder weights: so does the worker (none read)

    def build(self) -> tuple[Llama, KVCache]:
        from prebake.engine.bundled.runtime.loader import load_model, placeholder_model, torch_dtype

        if self.placeholders:
            model = placeholder_model(self.spec, self.dtype)
        else:
            model = load_model(self.spec, self.dtype)
        cache = KVCache.allocate(model.config, self.max_num_seqs, self.max_model_len, dtype=torch_dtype(self.dtype))
        return model, cache


@dataclass(frozen=True)
class Workers:
    """How many processes compile at once, and what they build the model from."""

    count: int
    source: ModelSource
    why: str  # what bounded the count, for the log


def plan_workers(
    source: ModelSource,
    model_bytes: int,
    shapes: int,
    *,
    asked: int | None = None,
    available: int | None = None,
    measure: Callable[[int], float] = cores_got,
) -> Workers:
    """The worker count for `shapes` shapes: `asked`, or every core this process may use that it
    measures free (`free_cores`); at most one per shape and as many as the available memory holds
    at `per_worker_bytes` each."""
    cores = usable_cores()
    free = available if available is not None else available_bytes()
    each = per_worker_bytes(model_bytes)
    limits = [
        (asked if asked is not None else cores, "asked" if asked is not None else f"{cores} cores"),
        (shapes, f"{shapes} shapes"),
        (free // each, f"{free / 2**30:.1f} GiB available at {each / 2**30:.1f} GiB a worker"),
    ]
    if asked is None and min(cores, shapes) > 1:
        limits.append(free_cores(cores, measure))
    count, why = min(limits, key=lambda limit: limit[0])
    return Workers(max(1, count), source, why)


def free_cores(cores: int, measure: Callable[[int], float] = cores_got) -> tuple[int, str]:
    """How many of `cores` are free, measured: `cores` busy threads of this process get `got` cores
    between them (runtime.openmp.cores_got), and a core counts where they got FREE_SHARE of one."""
    got = measure(cores)
    return max(1, min(cores, int(got / FREE_SHARE + 1e-9))), f"{got:.2f} of {cores} cores free, measured"


def per_worker_bytes(model_bytes: int) -> int:
    return WORKER_BASE_BYTES + MODEL_COPIES * model_bytes


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemAvailable (the kernel's estimate of what can be allocated without swapping); 4 GiB unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 4 << 30


CompileShape = Callable[[Llama, KVCache, StepShape, Tactic, dict], list[str]]  # runtime.aoti.compile_shape


def compile_one_by_one(
    model: Llama, cache: KVCache, tactics: dict[StepShape, Tactic], options: dict, log, compile_shape: CompileShape
) -> tuple[dict[StepShape, list[str]], dict[StepShape, float]]:
    built, seconds = {}, {}
    countdown = Countdown(len(tactics))
    with _bar(len(tactics)) as bar:
        for shape, tactic in tactics.items():
            started = time.perf_counter()
            built[shape] = compile_shape(model, cache, shape, tactic, options)
            seconds[shape] = time.perf_counter() - started
            log("  " + countdown.line(f"aoti {shape.name} [{tactic.label()}] {seconds[shape]:.2f} s"))
            bar.update(1)
    return built, seconds


def compile_in_workers(
    workers: Workers, tactics: dict[StepShape, Tactic], options: dict, log, compile_shape: CompileShape
) -> tuple[dict[StepShape, list[str]], dict[StepShape, float]]:
    """Every shape compiled in one of `workers.count` spawned processes; files and seconds per shape."""
    log(f"  aoti: {len(tactics)} shapes in {workers.count} worker processes ({workers.why})")
    built, seconds = {}, {}
    countdown = Countdown(len(tactics))
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers.count, mp_context=context, initializer=_start_worker, initargs=(workers.source,))
    with pool, _bar(len(tactics)) as bar:  # a worker that cannot start breaks the pool: raised, never hung
        jobs = [
            pool.submit(_compile_in_worker, compile_shape, shape, tactic, options) for shape, tactic in tactics.items()
        ]
        for job in as_completed(jobs):
            shape, files, took = job.result()
            built[shape], seconds[shape] = files, took
            log("  " + countdown.line(f"aoti {shape.name} [{tactics[shape].label()}] {took:.2f} s in a worker"))
            bar.update(1)
    return built, seconds


_WORKER: dict[str, tuple[Llama, KVCache]] = {}  # the worker process's model, built once


def _start_worker(source: ModelSource) -> None:
    quiet_dependency_deprecations()  # torch's, at every shape: the bake's output shows its own lines
    _WORKER["model"] = source.build()


def _compile_in_worker(
    compile_shape: CompileShape, shape: StepShape, tactic: Tactic, options: dict
) -> tuple[StepShape, list[str], float]:
    model, cache = _WORKER["model"]
    started = time.perf_counter()
    files = compile_shape(model, cache, shape, tactic, options)
    return shape, files, time.perf_counter() - started


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        return None


def _bar(total: int):
    """tqdm's bar of shapes done on stderr, or nothing where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="compiling step shapes", unit="shape", file=sys.stderr, mininterval=1.0)
