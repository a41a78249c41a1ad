"""Threshold dynamic programs: for every bucket count, the buckets that pad given step shapes least.

    values with weights --_threshold_curve--> the best k thresholds, for every k (exact DP)
    levels' curves --knapsack--> the best way to share k buckets among levels (exact)
    prompt_curve / decode_curve: nested levels the way vllm-gaudi looks buckets up

A curve's cost is the weighted padded work of one phase (padded tokens or rows over real ones,
plus padded context blocks over real ones). Each level's thresholds come from an exact DP over
the distinct values (O(k n^2), numpy; past MAX_CANDIDATES, weighted quantiles first, so
near-exact); the number of outer levels is chosen by trying each. docs/buckets.md.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from prebake.artifacts.buckets.replay import Shapes
from prebake.artifacts.buckets.sets import Bucket

MAX_CANDIDATES = 192  # distinct values per DP; above it, thresholds are drawn from weighted quantiles
MAX_OUTER_LEVELS = 64  # outer levels (decode batch, prompt query) tried
MAX_INNER_LEVELS = 32  # inner levels (blocks, context) per outer level
MAX_TIERS = 6  # context tiers tried by the nested-tier prompt fit


@dataclass(frozen=True)
class Curve:
    """The least cost for every bucket count k (inf: impossible), and the buckets that reach it."""

    costs: np.ndarray  # [top + 1]
    pick: Callable[[int], tuple[Any, ...]]


def empty_curve(top: int) -> Curve:
    costs = np.full(top + 1, np.inf)
    costs[0] = 0.0
    return Curve(costs, lambda k: ())


def as_buckets(phase: str, picked: tuple[Any, ...]) -> set[Bucket]:
    if phase == "prompt":
        return {Bucket(b, q, c) for b, (q, c) in picked}
    return {Bucket(b, 1, c) for b, c in picked}


def decode_curve(shapes: Shapes, top: int, batch_weight: float, block_weight: float) -> Curve:
    """Decode: batch levels from their own DP (each level count tried), blocks per level."""
    points = shapes.decode
    if not points:
        return empty_curve(top)
    real_b = sum(n * b for (b, _), n in points.items())
    real_c = sum(n * c for (_, c), n in points.items())
    batches = sorted({b for b, _ in points})
    batch_weights = [sum(n for (b, _), n in points.items() if b == v) * batch_weight / real_b for v in batches]
    return _nested(points, batches, batch_weights, block_weight / real_c, top)


def prompt_curve(shapes: Shapes, top: int, token_weight: float, ctx_weight: float, tiers: bool = False) -> Curve:
    """Prompt: one level per batch seen; per batch, query levels; per query level, ctx levels."""
    points = {(b, max(q, 2), c): n for (b, q, c), n in shapes.prompt.items()}
    if not points:
        return empty_curve(top)
    real_t = sum(n * b * q for (b, q, _), n in points.items())
    real_c = sum(n * b * c for (b, _, c), n in points.items()) or 1
    curves = []
    for batch in sorted({b for b, _, _ in points}):
        mine = {(q, c): n for (b, q, c), n in points.items() if b == batch}
        query = sorted({q for q, _ in mine})
        query_weights = [sum(n for (q, _), n in mine.items() if q == v) * batch * token_weight / real_t for v in query]
        if tiers:
            inner = _tier_curve(mine, batch * token_weight / real_t, batch * ctx_weight / real_c, top)
        else:
            inner = _nested(mine, query, query_weights, batch * ctx_weight / real_c, top)
        curves.append(Curve(inner.costs, _with_batch(inner, batch)))
    return _knapsack(curves, top)


def _tier_curve(points: dict[tuple[int, int], int], token_coeff: float, ctx_coeff: float, top: int) -> Curve:
    """Nested context tiers: context thresholds c_1 < ... < c_m (the exact context DP), and per
    query threshold a height h, its buckets being (query, c_1) .. (query, c_h). A step of tier j
    (context in (c_j-1, c_j]) pads to the first query threshold at or above its query whose height
    is at least j, and to c_j: exact under the first-holding lookup. Unlike `_nested`, a query
    level need not hold the long contexts of the steps in its range: they go on to the next level
    that does. Heights are raised greedily, the raise saving most per bucket first."""
    ctx_values = sorted({c for _, c in points})
    ctx_weights = [sum(n for (_, c), n in points.items() if c == v) * ctx_coeff for v in ctx_values]
    costs = np.full(top + 1, np.inf)
    picks: list[tuple[tuple[int, int], ...]] = [()] * (top + 1)
    for ctx_cost, tiers in _threshold_curve(ctx_values, ctx_weights, min(MAX_TIERS, top)):
        for used, token_cost, picked in _raise_heights(points, tiers, token_coeff, top):
            if token_cost + ctx_cost < costs[used]:
                costs[used], picks[used] = token_cost + ctx_cost, picked
    for k in range(1, top + 1):  # a fit of fewer buckets is a fit of k
        if costs[k - 1] < costs[k]:
            costs[k], picks[k] = costs[k - 1], picks[k - 1]
    return Curve(costs, lambda k: picks[k])


def _raise_heights(
    points: dict[tuple[int, int], int], tiers: list[int], token_coeff: float, top: int
) -> list[tuple[int, float, tuple[tuple[int, int], ...]]]:
    """From the widest query holding every tier, raise one query value's height at a time (the
    raise saving the most padded tokens per bucket it adds) until `top` buckets or no saving:
    (buckets, token cost, buckets as (query, ctx)) after each raise."""
    m, values = len(tiers), sorted({q for q, _ in points})
    n, v, cols = len(values), np.asarray(values, dtype=np.float64), np.arange(len(values))
    index = {q: i for i, q in enumerate(values)}
    weight = np.zeros((m, n))  # token weight of tier j's steps at each query value
    for (q, c), count in points.items():
        weight[bisect_left(tiers, c), index[q]] += count * token_coeff
    cum = np.concatenate([np.zeros((m, 1)), np.cumsum(weight, axis=1)], axis=1)
    height = np.zeros(n, dtype=np.int64)
    height[-1] = m
    used, out = m, []
    while True:
        gains, cost = np.zeros((m + 1, n)), 0.0  # gains[h, i]: saved by tiers below h if i joined them
        for j in range(m):
            at = np.flatnonzero(height > j)  # tier j's query thresholds; the widest is always one
            slot = np.searchsorted(at, cols, side="left")
            low = np.where(slot > 0, at[np.maximum(slot - 1, 0)] + 1, 0)
            saved = (v[at[slot]] - v) * (cum[j, cols + 1] - cum[j, low])
            gains[j + 1] = gains[j] + np.where(height > j, 0.0, saved)
            cost += float(v[at] @ (cum[j, at + 1] - cum[j, np.concatenate([[0], at[:-1] + 1])]))
        out.append((used, cost, tuple((values[i], tiers[h]) for i in np.flatnonzero(height) for h in range(height[i]))))
        best, choice = 0.0, (0, 0)
        for h in range(1, m + 1):
            extra = h - height
            per_bucket = (gains[h] - gains[height, cols]) / np.maximum(extra, 1)
            per_bucket[(extra <= 0) | (used + extra > top)] = 0.0
            i = int(np.argmax(per_bucket))
            if per_bucket[i] > best:
                best, choice = float(per_bucket[i]), (i, h)
        if best <= 0.0:
            return out
        used += choice[1] - int(height[choice[0]])
        height[choice[0]] = choice[1]


def _with_batch(inner: Curve, batch: int) -> Callable[[int], tuple[Any, ...]]:
    return lambda k: tuple((batch, qc) for qc in inner.pick(k))


def _nested(
    points: dict[tuple[int, int], int], outer: list[int], weights: list[float], inner_coeff: float, top: int
) -> Curve:
    """For each count of outer levels (their thresholds by DP), inner curves per level shared
    out by knapsack; the best total for every bucket count."""
    by_outer: dict[int, dict[int, float]] = {}
    for (x, y), n in points.items():
        by_outer.setdefault(x, {})
        by_outer[x][y] = by_outer[x].get(y, 0.0) + n * inner_coeff
    inner_cache: dict[tuple[int, int], Curve] = {}
    costs = np.full(top + 1, np.inf)
    owners: list[Curve | None] = [None] * (top + 1)
    for cost, tops in _threshold_curve(outer, weights, min(MAX_OUTER_LEVELS, top)):
        groups, low = [], -1  # below every value (context can be 0)
        for t in tops:
            if (low, t) not in inner_cache:
                members: dict[int, float] = {}
                for x in outer:
                    if low < x <= t:
                        for y, w in by_outer[x].items():
                            members[y] = members.get(y, 0.0) + w
                inner_cache[(low, t)] = _inner_curve(t, members, top)
            groups.append(inner_cache[(low, t)])
            low = t
        shared = _knapsack(groups, top)
        better = shared.costs + cost < costs
        costs = np.where(better, shared.costs + cost, costs)
        owners = [shared if b else o for b, o in zip(better, owners)]

    def pick(k: int) -> tuple[Any, ...]:
        owner = owners[k]
        return owner.pick(k) if owner is not None else ()

    return Curve(costs, pick)


def _inner_curve(outer: int, members: dict[int, float], top: int) -> Curve:
    values = sorted(members)
    weights = [members[v] for v in values]
    fits = _threshold_curve(values, weights, min(top, MAX_INNER_LEVELS))
    costs = np.full(top + 1, np.inf)
    costs[1 : len(fits) + 1] = [c for c, _ in fits]
    return Curve(costs, lambda k: tuple((outer, t) for t in fits[k - 1][1]) if k else ())


def _knapsack(curves: list[Curve], top: int) -> Curve:
    """Share `top` buckets among levels, each taking at least one, for the least total cost
    (a min-plus convolution per level, with the choices kept to walk back)."""
    acc = np.full(top + 1, np.inf)
    acc[0] = 0.0
    choices = []
    totals = np.arange(top + 1)
    for curve in curves:
        given = np.flatnonzero(np.isfinite(curve.costs[1:])) + 1  # the counts this level can take, k >= 1
        if given.size == 0:
            merged, taken = np.full(top + 1, np.inf), np.zeros(top + 1, dtype=np.int64)
        else:
            rest = totals[None, :] - given[:, None]  # what the levels before take: m - k
            table = np.where(rest >= 0, curve.costs[given][:, None] + acc[np.maximum(rest, 0)], np.inf)
            row = table.argmin(axis=0)  # the least k on ties
            merged = table[row, totals]
            taken = np.where(np.isfinite(merged), given[row], 0)  # 0 where no k gives a finite total
        choices.append(taken)
        acc = merged

    def pick(k: int) -> tuple[Any, ...]:
        parts: list[Any] = []
        for curve, taken in zip(reversed(curves), reversed(choices)):
            used = int(taken[k])
            parts.extend(curve.pick(used))
            k -= used
        return tuple(parts)

    return Curve(acc, pick)


def _threshold_curve(values: list[int], weights: list[float], kmax: int) -> list[tuple[float, list[int]]]:
    """For k = 1..kmax: the k thresholds (the largest value among them) minimising
    sum(weight * least threshold at or above the value). An exact DP over candidate thresholds:
    the values themselves when at most MAX_CANDIDATES, else weighted quantiles (near-exact)."""
    cand_values, cand_weights = _candidates(values, weights)
    n = len(cand_values)
    v = np.asarray(cand_values, dtype=np.float64)
    cum = np.concatenate([[0.0], np.cumsum(cand_weights)])  # cum[i]: weight of the first i values
    # dp[i]: least cost of the first i+1 values with at most t thresholds, the last at value i.
    dp = v * cum[1:]
    rows = np.arange(n)
    lower = np.tril(np.ones((n, n), dtype=bool), k=-1)  # j < i
    span = v[:, None] * (cum[1:, None] - cum[None, 1:])  # cost of values j+1..i at threshold i
    choices: list[np.ndarray] = []
    curve = [(float(dp[-1]), _walk(cand_values, choices, n - 1))]
    for _ in range(min(kmax, n) - 1):
        matrix = np.where(lower, dp[None, :] + span, np.inf)
        prev = np.argmin(matrix, axis=1)
        via = matrix[rows, prev]
        better = via < dp
        choices.append(np.where(better, prev, -1))
        dp = np.where(better, via, dp)
        curve.append((float(dp[-1]), _walk(cand_values, choices, n - 1)))
    return curve


def _walk(cand_values: list[int], choices: list[np.ndarray], i: int) -> list[int]:
    tops = [cand_values[i]]
    for choice in reversed(choices):
        j = int(choice[i])
        if j >= 0:
            tops.append(cand_values[j])
            i = j
    return sorted(tops)


def _candidates(values: list[int], weights: list[float]) -> tuple[list[int], list[float]]:
    if len(values) <= MAX_CANDIDATES:
        return values, weights
    cum = np.cumsum(weights)
    marks = np.searchsorted(cum, np.linspace(0, cum[-1], MAX_CANDIDATES + 1)[1:], side="left")
    keep = sorted({int(m) for m in np.minimum(marks, len(values) - 1)} | {len(values) - 1})
    merged, start = [], 0
    for idx in keep:  # each value joins the next candidate at or above it: exact for these thresholds
        merged.append(float(sum(weights[start : idx + 1])))
        start = idx + 1
    return [values[i] for i in keep], merged
