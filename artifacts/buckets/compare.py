"""Bucket strategies compared: each strategy's set for a recipe's limits, and its padding on traffic.

    compare(limits, settings, Asked(trace=fit.csv, evaluate=eval.jsonl, budget=40))  ->  Comparison
        replays the fit trace (default: the recipe's) and the evaluation trace (default: the fit trace)
        builds each strategy's set (traffic: fitted on the fit trace's shapes, within the budget)
        figures each set on the evaluation traffic (report.py); with no trace at all, only the counts

`prebake buckets` prints a Comparison (render, to_json) and may write its chosen set
(`write_set`) as the buckets artifact's buckets.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.buckets.replay import ReplaySettings, Shapes, replay
from prebake.artifacts.buckets.report import STRATEGY_ORDER, Figures, Strategy, figures, strategy_set
from prebake.artifacts.buckets.sets import BucketSet
from prebake.artifacts.buckets.traces import read_trace
from prebake.artifacts.errors import BucketError
from prebake.artifacts.fsutil import atomic_target

_TRAFFIC_NEEDS_TRACE = (
    "the traffic strategy fits a set on traffic: pass --trace FILE (.csv or .jsonl; recipe {name} names none), "
    "or pick exponential, linear or pad"
)


@dataclass(frozen=True)
class Asked:
    """What `prebake buckets` was asked; None: the recipe's setting (or every strategy)."""

    strategies: tuple[Strategy, ...] = ()
    trace: Path | None = None  # the traffic to fit on
    evaluate: Path | None = None  # the traffic to report on
    budget: int | None = None  # traffic: the most buckets in all
    rate: float | None = None  # replay at this many requests per second


@dataclass(frozen=True)
class Comparison:
    """Each strategy's set and, with traffic, its figures on the evaluation traffic."""

    name: str  # the recipe's model
    sets: dict[str, BucketSet]
    figures: dict[str, Figures] | None  # None: no traffic to measure padding on

    def chosen(self) -> BucketSet:
        """The set `--out` writes: the traffic set where there is one, else the first strategy's."""
        return self.sets.get("traffic") or next(iter(self.sets.values()))

    def to_json(self) -> dict[str, object]:
        if self.figures is not None:
            return {s: f.to_json() for s, f in self.figures.items()}
        return {
            s: {"prompt": len(b.prompt), "decode": len(b.decode), "waste": None, "unfitted": None}
            | ({"buckets": b.to_json()} if len(self.sets) == 1 else {})
            for s, b in self.sets.items()
        }

    def render(self) -> str:
        return "\n".join(self._traffic_lines() if self.figures is not None else self._rule_lines())

    def _traffic_lines(self) -> list[str]:
        assert self.figures is not None
        head = f"{'strategy':12s} {'prompt':>7s} {'decode':>7s} {'pf_tok':>7s} {'pf_ctx':>7s} {'dc_bat':>7s} {'dc_blk':>7s}"
        return [f"{head} unfitted"] + [
            f"{s:12s} {f.prompt:7d} {f.decode:7d} {f.prefill_tokens:7.1%} {f.prefill_ctx:7.1%} "
            f"{f.decode_batch:7.1%} {f.decode_blocks:7.1%} {f.unfitted}"
            for s, f in self.figures.items()
        ]

    def _rule_lines(self) -> list[str]:
        lines = [f"{'strategy':12s} {'prompt':>7s} {'decode':>7s} {'total':>7s}"]
        lines += [
            f"{s:12s} {len(b.prompt):7d} {len(b.decode):7d} {len(b.prompt) + len(b.decode):7d}"
            for s, b in self.sets.items()
        ]
        if len(self.sets) == 1:
            (only,) = self.sets.values()
            for phase, buckets in (("prompt", only.prompt), ("decode", only.decode)):
                shown = " ".join(f"({b.batch},{b.query},{b.ctx_blocks})" for b in buckets)
                lines.append(f"{phase} buckets (batch, query, ctx_blocks): {shown}")
        else:
            lines.append("--strategy NAME shows that set's buckets")
        lines.append(
            f"padding waste and the traffic strategy need traffic: pass --trace FILE (recipe {self.name} names none)"
        )
        return lines


def compare(limits: ServingLimits, settings: BucketSettings, asked: Asked, *, name: str) -> Comparison:
    """The sets of the strategies asked for these limits, figured on traffic when a trace is given."""
    if asked.budget is not None and asked.budget < 1:
        raise BucketError(f"--budget {asked.budget} must be a positive number of buckets")
    fit_path = asked.trace or (Path(settings.trace) if settings.trace else None)
    if fit_path is None and asked.evaluate is None:
        return _without_traffic(limits, asked, name)
    replaying = ReplaySettings(rate=asked.rate if asked.rate is not None else settings.rate)
    eval_shapes = replay(read_trace(asked.evaluate), limits, replaying) if asked.evaluate is not None else None
    fit_shapes = replay(read_trace(fit_path), limits, replaying) if fit_path is not None else None
    strategies = asked.strategies or tuple(s for s in STRATEGY_ORDER if s != "traffic" or fit_shapes is not None)
    if "traffic" in strategies and fit_shapes is None:
        raise BucketError(_TRAFFIC_NEEDS_TRACE.format(name=name))
    measured: Shapes | None = eval_shapes if eval_shapes is not None else fit_shapes
    assert measured is not None  # a fit trace or an evaluation trace was given
    budget = asked.budget if asked.budget is not None else settings.budget
    max_waste = settings.max_waste if asked.budget is None else None
    sets: dict[str, BucketSet] = {
        s: strategy_set(s, limits, fit_shapes, budget=budget, max_waste=max_waste) for s in strategies
    }
    return Comparison(name, sets, {s: figures(b, measured) for s, b in sets.items()})


def _without_traffic(limits: ServingLimits, asked: Asked, name: str) -> Comparison:
    """No trace: each rule-based set for these limits. Padding waste needs traffic to measure, so it is
    left out and the way to get it is named."""
    strategies = asked.strategies or tuple(s for s in STRATEGY_ORDER if s != "traffic")
    if "traffic" in strategies:
        raise BucketError(_TRAFFIC_NEEDS_TRACE.format(name=name))
    return Comparison(name, {s: strategy_set(s, limits, None) for s in strategies}, None)


def write_set(path: Path, chosen: BucketSet) -> None:
    """`chosen` as the buckets artifact's buckets.json, written atomically."""
    with atomic_target(path) as tmp:
        tmp.write_text(json.dumps(chosen.to_json(), indent=1, sort_keys=True))
