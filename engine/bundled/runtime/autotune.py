"""Autotune: measure each step shape under every tactic on this host; keep a winner only when it wins.

Tactics change speed, never results: the attention implementation (SDPA with a mask, or explicit
matmul-softmax-matmul). The thread count is no tactic: kernels read the serving host's when they run
(runtime.steps.threads_at_run_time). A shape's tactics are timed interleaved (the order rotated each
round, so a burst of load falls on all), eager, after warm-up: medians, and spreads (interquartile;
the whole range under four runs). A fastest whose spread overlaps the runner-up's is a tie: the
default (first) tactic is kept and the tie recorded, never claimed. autotune.json keeps every timing
and the conditions (cores, affinity, load average): {"tactics", "threads": "serving host",
"conditions", "shapes": [{"shape", "timings_ms", "spread_ms", "winner", "tie", "fastest"}, ...]}.
"""

from __future__ import annotations

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

SERVING_HOST = "serving host"  # what autotune.json says of the thread count


def candidate_tactics(spec: AutotuneSpec) -> list[Tactic]:
    """The tactics to time; the first is the default a tie keeps."""
    impls = ATTN_IMPLS if "attn_impl" in spec.tactics else ("sdpa",)
    return [Tactic(a) for a in impls]


def measure(steps: CompiledSteps, shapes: list[StepShape], spec: AutotuneSpec, log=print) -> dict:
    """Time every tactic on every shape, interleaved; return the autotune.json document."""
    tactics = candidate_tactics(spec)
    before = _conditions()
    results = []
    countdown = Countdown(len(shapes))
    for shape in shapes:
        samples = _interleaved(steps, shape, tactics, spec)
        row = verdict(tactics, samples)
        row["shape"] = asdict(shape)
        what = "tie, default kept" if row["tie"] else "wins"
        best = Tactic(**row["winner"]).label()
        log("  " + countdown.line(f"autotune {shape.name}: {best} {what} ({row['timings_ms'][best]:.3f} ms)"))
        results.append(row)
    return {
        "tactics": {"attn_impl": sorted({t.attn_impl for t in tactics})},
        "threads": SERVING_HOST,
        "conditions": {
            **before,
            "load_average_after": _load(),
            "order": "interleaved",
            "warmup": spec.warmup,
            "iterations": spec.iterations,
        },
        "shapes": results,
    }


def verdict(tactics: list[Tactic], samples: dict[str, list[float]]) -> dict:
    """One shape's row from its samples (ms by tactic label): medians, spreads, and the winner, or a
    tie when the fastest median's spread overlaps the next one's (the default tactic is then kept)."""
    medians = {label: round(statistics.median(times), 4) for label, times in samples.items()}
    spreads = {label: _spread(times) for label, times in samples.items()}
    ranked = sorted(tactics, key=lambda t: medians[t.label()])
    winner, tie = ranked[0], False
    if len(ranked) > 1:
        best, next_best = spreads[ranked[0].label()], spreads[ranked[1].label()]
        tie = best[1] >= next_best[0]  # the fastest's slow end reaches the runner-up's fast end
    if tie:
        winner = tactics[0]
    return {
        "timings_ms": medians,
        "spread_ms": spreads,
        "winner": asdict(winner),
        "tie": tie,
        "fastest": ranked[0].label(),
    }


def winners(document: dict) -> dict[StepShape, Tactic]:
    """The tactic to run each shape with, from an autotune.json document (a `threads` an older
    document recorded is not applied: the serving host's thread count is)."""
    return {StepShape(**row["shape"]): Tactic(attn_impl=row["winner"]["attn_impl"]) for row in document["shapes"]}


def load_winners(path: Path) -> dict[StepShape, Tactic]:
    return winners(json.loads(Path(path).read_text()))


def _interleaved(steps: CompiledSteps, shape: StepShape, tactics: list[Tactic], spec: AutotuneSpec) -> dict:
    for tactic in tactics:
        for _ in range(spec.warmup):
            steps.run_dummy(shape, tactic)
    samples: dict[str, list[float]] = {t.label(): [] for t in tactics}
    for round_ in range(spec.iterations):
        shift = round_ % len(tactics)
        for tactic in tactics[shift:] + tactics[:shift]:
            started = time.perf_counter()
            steps.run_dummy(shape, tactic)
            samples[tactic.label()].append((time.perf_counter() - started) * 1e3)
    return samples


def _spread(times: list[float]) -> list[float]:
    """The interquartile range of `times` (ms); the whole range when there are under four."""
    if len(times) < 4:
        return [round(min(times), 4), round(max(times), 4)]
    quartiles = statistics.quantiles(times, n=4)
    return [round(quartiles[0], 4), round(quartiles[2], 4)]


def _conditions() -> dict:
    import torch

    return {
        "cpus": os.cpu_count() or 1,
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
        "torch_threads": torch.get_num_threads(),
        "load_average": _load(),
    }


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else []
