"""The traffic strategy: bucket sets fitted to a replayed trace, with every allowed shape covered.

    trace --replay--> step shapes with counts --fit--> fitted buckets + cover buckets -> BucketSet

The objective is padded compute, each of the four figures normalised by its real total so that
none dominates: prompt tokens (batch * query) and context blocks (batch * ctx), decode batch and
decode blocks. Buckets are nested the way vllm-gaudi looks them up (first bucket in sorted order
that holds a shape): per batch level, query (or decode block) thresholds, and per query level,
context thresholds. Each level's thresholds come from an exact dynamic program over the
distinct values seen (`_threshold_curve`, O(k n^2), numpy); levels share the budget through an exact
knapsack over their cost curves. The outer split (decode batch levels) is chosen per level count
by its own DP, so the whole is near-exact: per-dimension optima, jointly budgeted.

Cover buckets make sure no step the limits allow is left without a bucket:
prompt (b, min(max_num_batched_tokens // b, max_model_len), (max_model_len - 1) // block_size)
for each distinct b-limited query top, (1, widest query, every whole number of chunks of context)
for chunked prefill, and decode (max_num_seqs, 1, all sequences at
max_model_len, or the device's blocks with contiguous PA). Prompt queries are at least 2 tokens,
since a bucket file reads query 1 as a decode bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .bucket_rules import device_blocks
from .bucket_set import Bucket, BucketSet, Phase
from .errors import BucketError
from .limits import BucketSettings, ServingLimits
from .replay import ReplaySettings, Shapes, replay
from .traces import read_trace

MAX_CANDIDATES = 192  # distinct values per DP; above it, thresholds are drawn from weighted quantiles
MAX_OUTER_LEVELS = 64  # outer levels (decode batch, prompt query) tried
MAX_INNER_LEVELS = 32  # inner levels (blocks, context) per outer level
MAX_FIT = 128  # most fitted buckets per phase (max_waste mode)


def fit_recipe_settings(limits: ServingLimits, settings: BucketSettings, trace: Path) -> BucketSet:
    """Read, replay and fit, as the recipe's [buckets] says."""
    shapes = replay(read_trace(trace), limits, ReplaySettings(rate=settings.rate))
    return fit_bucket_set(limits, shapes, budget=settings.budget, max_waste=settings.max_waste)


def cover_buckets(limits: ServingLimits) -> tuple[set[Bucket], set[Bucket]]:
    """The fewest buckets that hold every prompt and decode step the limits allow."""
    top_ctx = (limits.max_model_len - 1) // limits.block_size
    tops: dict[int, int] = {}
    for batch in range(1, limits.prefill_seqs + 1):
        query = max(2, min(limits.max_num_batched_tokens // batch, limits.max_model_len))
        tops.setdefault(query, batch)
        tops[query] = max(tops[query], batch)
    prompt = {Bucket(b, q, top_ctx) for q, b in tops.items()}
    # Chunked prefill puts whole chunks of context before each later chunk: one level per chunk
    # count on the widest query, so long prompts a fit never saw do not pad to the top context.
    chunk = limits.max_num_batched_tokens // limits.block_size
    widest = max(2, min(limits.max_num_batched_tokens, limits.max_model_len))
    prompt |= {Bucket(1, widest, c) for c in range(0, top_ctx, chunk) if chunk > 0}
    per_seq = math.ceil(limits.max_model_len / limits.block_size)
    blocks = device_blocks(limits) if not limits.enable_prefix_caching else limits.max_num_seqs * per_seq
    return prompt, {Bucket(limits.max_num_seqs, 1, max(blocks, limits.max_num_seqs))}


def fit_bucket_set(
    limits: ServingLimits, shapes: Shapes, *, budget: int | None = None, max_waste: float | None = None
) -> BucketSet:
    """The bucket set of at most `budget` buckets (or the smallest with every figure's padding
    under `max_waste`) that pads the replayed shapes least, cover included."""
    if (budget is None) == (max_waste is None):
        raise BucketError("fit a traffic set with exactly one of budget or max_waste")
    cover_prompt, cover_decode = cover_buckets(limits)
    floor = len(cover_prompt) + len(cover_decode)
    if budget is not None and budget < floor + 2:
        raise BucketError(
            f"budget {budget} is too small: these limits need {floor} cover buckets plus at least one "
            f"prompt and one decode bucket; raise budget to at least {floor + 2}"
        )
    top = MAX_FIT if budget is None else budget - floor
    prompt_curve = _prompt_curve(shapes, top)
    decode_curve = _decode_curve(shapes, top)
    if budget is not None:
        k_prompt, k_decode = _split(prompt_curve, decode_curve, top, _prefill_share(shapes))
    else:
        assert max_waste is not None  # one of the two was checked above
        k_prompt = _smallest(
            prompt_curve, lambda k: _figures(limits, "prompt", prompt_curve.pick(k), cover_prompt, shapes), max_waste
        )
        k_decode = _smallest(
            decode_curve, lambda k: _figures(limits, "decode", decode_curve.pick(k), cover_decode, shapes), max_waste
        )
    prompt = cover_prompt | _as_buckets("prompt", prompt_curve.pick(k_prompt))
    decode = cover_decode | _as_buckets("decode", decode_curve.pick(k_decode))
    return BucketSet("traffic", limits.block_size, tuple(sorted(prompt)), tuple(sorted(decode)))


@dataclass(frozen=True)
class Curve:
    """The least cost for every bucket count k (inf: impossible), and the buckets that reach it."""

    costs: np.ndarray  # [top + 1]
    pick: Callable[[int], tuple[Any, ...]]


def _empty_curve(top: int) -> Curve:
    costs = np.full(top + 1, np.inf)
    costs[0] = 0.0
    return Curve(costs, lambda k: ())


def _as_buckets(phase: str, picked: tuple[Any, ...]) -> set[Bucket]:
    if phase == "prompt":
        return {Bucket(b, q, c) for b, (q, c) in picked}
    return {Bucket(b, 1, c) for b, c in picked}


def _figures(
    limits: ServingLimits, phase: Phase, picked: tuple[Any, ...], cover: set[Bucket], shapes: Shapes
) -> tuple[float, float]:
    both = tuple(sorted(_as_buckets(phase, picked) | cover))
    bucket_set = BucketSet(
        "traffic", limits.block_size, both if phase == "prompt" else (), both if phase == "decode" else ()
    )
    report = bucket_set.padding(phase, shapes.prompt if phase == "prompt" else shapes.decode)
    return report.token_waste, report.block_waste


def _smallest(curve: Curve, figures: Callable[[int], tuple[float, float]], max_waste: float) -> int:
    for k, cost in enumerate(curve.costs):
        if np.isfinite(cost) and max(figures(k)) <= max_waste:
            return k
    raise BucketError(
        f"no traffic set of up to {MAX_FIT} fitted buckets per phase keeps padding under max_waste "
        f"{max_waste}; raise max_waste or set a budget instead"
    )


def _prefill_share(shapes: Shapes) -> float:
    """Prefill's weight against decode: its share of the tokens the model computes (prompt tokens
    against decode rows), blended half and half with an even split."""
    prefill = sum(n * b * q for (b, q, _), n in shapes.prompt.items())
    decode = sum(n * b for (b, _), n in shapes.decode.items())
    share = prefill / (prefill + decode) if prefill + decode else 0.5
    return (share + 0.5) / 2  # half by compute share, half even: neither phase starves


def _split(prompt: Curve, decode: Curve, top: int, prefill_share: float) -> tuple[int, int]:
    """Share the budget between the phases for the least total cost, each phase's normalised
    padding weighted by its share of the computed tokens."""
    best = None
    for kp in range(top + 1):
        rest = decode.costs[: top - kp + 1]
        kd = int(np.argmin(rest))
        total = prefill_share * prompt.costs[kp] + (1 - prefill_share) * rest[kd]
        if np.isfinite(total) and (best is None or total < best[0]):
            best = (total, kp, kd)
    if best is None:
        raise BucketError(f"a budget of {top} fitted buckets cannot hold the traffic's levels; raise the budget")
    return best[1], best[2]


def _decode_curve(shapes: Shapes, top: int) -> Curve:
    """Decode: batch levels from their own DP (each level count tried), blocks per level."""
    points = shapes.decode
    if not points:
        return _empty_curve(top)
    real_b = sum(n * b for (b, _), n in points.items())
    real_c = sum(n * c for (_, c), n in points.items())
    batches = sorted({b for b, _ in points})
    batch_weights = [sum(n for (b, _), n in points.items() if b == v) / real_b for v in batches]
    return _nested(points, batches, batch_weights, 1 / real_c, top)


def _prompt_curve(shapes: Shapes, top: int) -> Curve:
    """Prompt: one level per batch seen; per batch, query levels; per query level, ctx levels."""
    points = {(b, max(q, 2), c): n for (b, q, c), n in shapes.prompt.items()}
    if not points:
        return _empty_curve(top)
    real_t = sum(n * b * q for (b, q, _), n in points.items())
    real_c = sum(n * b * c for (b, _, c), n in points.items()) or 1
    curves = []
    for batch in sorted({b for b, _, _ in points}):
        mine = {(q, c): n for (b, q, c), n in points.items() if b == batch}
        query = sorted({q for q, _ in mine})
        weights = [sum(n for (q, _), n in mine.items() if q == v) * batch / real_t for v in query]
        inner = _nested(mine, query, weights, batch / real_c, top)
        curves.append(Curve(inner.costs, _with_batch(inner, batch)))
    return _knapsack(curves, top)


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
        groups, low = [], 0
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
    for curve in curves:
        merged, taken = np.full(top + 1, np.inf), np.zeros(top + 1, dtype=np.int64)
        for k in range(1, top + 1):
            if not np.isfinite(curve.costs[k]):
                continue
            candidate = acc[: top + 1 - k] + curve.costs[k]
            better = candidate < merged[k:]
            merged[k:] = np.where(better, candidate, merged[k:])
            taken[k:] = np.where(better, k, taken[k:])
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
