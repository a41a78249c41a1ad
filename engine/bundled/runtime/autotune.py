"""Autotune: measure each step shape under every tactic on this host and keep the fastest.

Tactics change speed, never results: the attention implementation (SDPA with a mask, or
explicit matmul-softmax-matmul) and the intra-op thread count. Each (shape, tactic) is timed in
eager mode after warm-up, median of the recipe's iterations; the winner per shape is what the
graphs are compiled with. autotune.json keeps every timing, so a surprising choice can be audited:

    {"tactics": {"attn_impl": [...], "threads": [...]},
     "shapes": [{"shape": {...}, "timings_ms": {"attn_impl=sdpa,threads=2": 1.9, ...}, "winner": {...}}, ...]}
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from prebake.artifacts.recipe.schema import AutotuneSpec
from prebake.engine.bundled.runtime.model import ATTN_IMPLS
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
from prebake.engine.common.logs import Countdown


def candidate_tactics(spec: AutotuneSpec, cpu_count: int | None = None) -> list[Tactic]:
    cpus = cpu_count or os.cpu_count() or 1
    impls = ATTN_IMPLS if "attn_impl" in spec.tactics else ("sdpa",)
    threads = sorted({1, cpus}) if "threads" in spec.tactics else [0]
    return [Tactic(a, t) for a, t in itertools.product(impls, threads)]


def measure(steps: CompiledSteps, shapes: list[StepShape], spec: AutotuneSpec, log=print) -> dict:
    """Time every tactic on every shape; return the autotune.json document."""
    tactics = candidate_tactics(spec)
    results = []
    countdown = Countdown(len(shapes))
    for shape in shapes:
        timings = {t.label(): _time(steps, shape, t, spec) for t in tactics}
        winner = min(tactics, key=lambda t: timings[t.label()])
        log("  " + countdown.line(f"autotune {shape.name}: {winner.label()} ({timings[winner.label()]:.3f} ms)"))
        results.append({"shape": asdict(shape), "timings_ms": timings, "winner": asdict(winner)})
    return {
        "tactics": {
            "attn_impl": sorted({t.attn_impl for t in tactics}),
            "threads": sorted({t.threads for t in tactics}),
        },
        "shapes": results,
    }


def winners(document: dict) -> dict[StepShape, Tactic]:
    """The tactic to run each shape with, from an autotune.json document."""
    return {StepShape(**row["shape"]): Tactic(**row["winner"]) for row in document["shapes"]}


def load_winners(path: Path) -> dict[StepShape, Tactic]:
    return winners(json.loads(Path(path).read_text()))


def _time(steps: CompiledSteps, shape: StepShape, tactic: Tactic, spec: AutotuneSpec) -> float:
    for _ in range(spec.warmup):
        steps.run_dummy(shape, tactic)
    samples = []
    for _ in range(spec.iterations):
        started = time.perf_counter()
        steps.run_dummy(shape, tactic)
        samples.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(samples), 4)
