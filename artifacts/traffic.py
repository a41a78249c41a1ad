"""The traffic strategy: bucket sets fitted to a replayed trace, with every allowed shape covered.

    trace --replay--> step shapes with counts --fit--> fitted buckets + edges + cover -> BucketSet

Four figures measure a set on traffic: padded prompt tokens (batch * query) and context blocks
(batch * ctx), padded decode rows and decode blocks, each normalised by its real total. Buckets
are nested the way vllm-gaudi looks them up (first bucket in sorted order that holds a shape):
per batch level, query (or decode block) thresholds, and per query level, context thresholds.
Each level's thresholds come from an exact dynamic program over the distinct values seen
(`_threshold_curve`, O(k n^2), numpy); levels share the budget through an exact knapsack over
their cost curves. The outer split (decode batch levels) is chosen per level count by its own
DP, so one fit is near-exact for a weighting of the four figures.

With a budget, the weighting is chosen too (`_balanced`): the fit that minimises its worst figure,
each taken against the default exponential set's on the same shapes (a min-max: no figure worse
than the set it replaces, where the budget allows, and all as far below it as they can go
together), by multiplicative re-weighting over a few fits. With max_waste, each phase takes the
fewest buckets that keep both its figures under the bound.

Cover buckets make sure no step the limits allow is left without a bucket:
prompt (b, min(max_num_batched_tokens // b, max_model_len), (max_model_len - 1) // block_size)
for each distinct b-limited query top, (1, widest query, every whole number of chunks of context)
for chunked prefill, and decode (max_num_seqs, 1, all sequences at max_model_len, or the device's
blocks with contiguous PA). Edge buckets (`edge_buckets`) climb from the busiest decode step the
fit saw to that cover bucket, doubling batch and blocks, so traffic a little busier than the fit's
pads at most about twofold. Prompt queries are at least 2 tokens, since a bucket file reads query 1
as a decode bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .bucket_rules import device_blocks, upstream_set
from .bucket_set import Bucket, BucketSet, Phase
from .errors import BucketError
from .limits import BucketSettings, ServingLimits
from .replay import ReplaySettings, Shapes, replay
from .traces import read_trace

MAX_CANDIDATES = 192  # distinct values per DP; above it, thresholds are drawn from weighted quantiles
MAX_OUTER_LEVELS = 64  # outer levels (decode batch, prompt query) tried
MAX_INNER_LEVELS = 32  # inner levels (blocks, context) per outer level
MAX_FIT = 128  # most fitted buckets per phase (max_waste mode)
BALANCE_ROUNDS = 10  # fits tried while re-weighting the four figures (budget mode)
BALANCE_STEP = 0.5  # damping: a figure's weight moves by the square root of how far it lags

RATIO_FLOOR = 0.05  # a figure far ahead keeps some weight, so it can come back
REFIT_ROUNDS = 3  # refits that hand buckets shared with the cover back to the fit
REFERENCE_FLOOR = 0.01  # a default-strategy figure under 1% counts as 1%: no ratio against nothing


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
    return prompt, {Bucket(limits.max_num_seqs, 1, _decode_top_blocks(limits))}


def _decode_top_blocks(limits: ServingLimits) -> int:
    per_seq = math.ceil(limits.max_model_len / limits.block_size)
    blocks = device_blocks(limits) if not limits.enable_prefix_caching else limits.max_num_seqs * per_seq
    return max(blocks, limits.max_num_seqs)


def edge_buckets(limits: ServingLimits, shapes: Shapes) -> set[Bucket]:
    """Decode buckets from the busiest step the fit saw up to the cover, doubling batch and blocks
    each step (the exponential strategy's spacing): traffic a little busier than the fit's then
    pads at most twofold instead of to the cover's every-sequence-at-full-length bucket."""
    if not shapes.decode:
        return set()
    seqs, blocks = limits.max_num_seqs, _decode_top_blocks(limits)
    batch, block = max(b for b, _ in shapes.decode), max(c for _, c in shapes.decode)
    edges = set()
    while batch < seqs or block < blocks:
        batch, block = min(2 * batch, seqs), min(2 * block, blocks)
        edges.add(Bucket(batch, 1, block))
    return edges - cover_buckets(limits)[1]


def least_budget(limits: ServingLimits, shapes: Shapes) -> int:
    """The fewest buckets a traffic set can have: cover and edges, one prompt and one decode bucket."""
    prompt, decode = cover_buckets(limits)
    return len(prompt) + len(decode | edge_buckets(limits, shapes)) + 2


def fit_bucket_set(
    limits: ServingLimits, shapes: Shapes, *, budget: int | None = None, max_waste: float | None = None
) -> BucketSet:
    """The bucket set of at most `budget` buckets (or the smallest with every figure's padding
    under `max_waste`) that pads the replayed shapes least, cover included."""
    if (budget is None) == (max_waste is None):
        raise BucketError("fit a traffic set with exactly one of budget or max_waste")
    cover_prompt, cover_decode = cover_buckets(limits)
    cover = (cover_prompt, cover_decode | edge_buckets(limits, shapes))
    if budget is None:
        assert max_waste is not None  # one of the two was checked above
        return _least_under(limits, shapes, cover, max_waste)
    floor = len(cover[0]) + len(cover[1])
    if budget < floor + 2:
        raise BucketError(
            f"budget {budget} is too small: these limits and this traffic need {floor} cover and edge "
            f"buckets plus at least one prompt and one decode bucket; raise budget to at least {floor + 2}"
        )
    return _balanced(limits, shapes, cover, budget)


Cover = tuple[set[Bucket], set[Bucket]]
Weights = tuple[float, float, float, float]  # prefill tokens, prefill ctx, decode batch, decode blocks


def _balanced(limits: ServingLimits, shapes: Shapes, cover: Cover, budget: int) -> BucketSet:
    """The fit whose worst figure, each against the default strategy's on the same shapes, is
    least (ties: the least sum): a min-max over the four figures, found by multiplicative
    re-weighting over a few fits, a figure that lags gaining weight as far as it lags."""
    reference = np.maximum(_waste(upstream_set(limits, BucketSettings()), shapes), REFERENCE_FLOOR)
    weights = np.ones(4)
    best: tuple[tuple[float, float], BucketSet] | None = None
    for _ in range(BALANCE_ROUNDS):
        fitted = _fit(limits, shapes, cover, budget, (weights[0], weights[1], weights[2], weights[3]))
        ratios = _waste(fitted, shapes) / reference
        score = (float(ratios.max()), float(ratios.sum()))
        if best is None or score < best[0]:
            best = (score, fitted)
        lag = np.maximum(ratios, RATIO_FLOOR)
        weights = weights * (lag / lag.mean()) ** BALANCE_STEP
    assert best is not None  # BALANCE_ROUNDS >= 1
    return best[1]


def _waste(bucket_set: BucketSet, shapes: Shapes) -> np.ndarray:
    prompt = bucket_set.padding("prompt", shapes.prompt)
    decode = bucket_set.padding("decode", shapes.decode)
    return np.array([prompt.token_waste, prompt.block_waste, decode.token_waste, decode.block_waste])


def _fit(limits: ServingLimits, shapes: Shapes, cover: Cover, budget: int, weights: Weights) -> BucketSet:
    """The least weighted padding in `budget` buckets. A fitted bucket that is also a cover bucket
    costs nothing, so the buckets it frees go back to the fit (a few times, while it stays in budget)."""
    top, fitted = budget - len(cover[0]) - len(cover[1]), None
    for _ in range(REFIT_ROUNDS):
        prompt_curve, decode_curve = _prompt_curve(shapes, top, weights), _decode_curve(shapes, top, weights)
        k_prompt, k_decode = _split(prompt_curve, decode_curve, top, _prefill_share(shapes))
        candidate = _bucket_set(limits, cover, prompt_curve.pick(k_prompt), decode_curve.pick(k_decode))
        spare = budget - len(candidate.prompt) - len(candidate.decode)
        if spare < 0:
            break
        fitted, top = candidate, top + spare
        if spare == 0:
            break
    if fitted is None:  # the first round always fits: its buckets number at most top + cover
        raise BucketError(f"a budget of {budget} buckets cannot hold the traffic's levels; raise the budget")
    return fitted


def _least_under(limits: ServingLimits, shapes: Shapes, cover: Cover, max_waste: float) -> BucketSet:
    """Per phase, the fewest fitted buckets that keep both of its figures under max_waste."""
    even = (1.0, 1.0, 1.0, 1.0)
    prompt_curve, decode_curve = _prompt_curve(shapes, MAX_FIT, even), _decode_curve(shapes, MAX_FIT, even)
    k_prompt = _smallest(
        prompt_curve, lambda k: _figures(limits, "prompt", prompt_curve.pick(k), cover[0], shapes), max_waste
    )
    k_decode = _smallest(
        decode_curve, lambda k: _figures(limits, "decode", decode_curve.pick(k), cover[1], shapes), max_waste
    )
    return _bucket_set(limits, cover, prompt_curve.pick(k_prompt), decode_curve.pick(k_decode))


def _bucket_set(limits: ServingLimits, cover: Cover, prompt: tuple[Any, ...], decode: tuple[Any, ...]) -> BucketSet:
    return BucketSet(
        "traffic",
        limits.block_size,
        tuple(sorted(cover[0] | _as_buckets("prompt", prompt))),
        tuple(sorted(cover[1] | _as_buckets("decode", decode))),
    )


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


def _decode_curve(shapes: Shapes, top: int, weights: Weights) -> Curve:
    """Decode: batch levels from their own DP (each level count tried), blocks per level."""
    points = shapes.decode
    if not points:
        return _empty_curve(top)
    real_b = sum(n * b for (b, _), n in points.items())
    real_c = sum(n * c for (_, c), n in points.items())
    batches = sorted({b for b, _ in points})
    batch_weights = [sum(n for (b, _), n in points.items() if b == v) * weights[2] / real_b for v in batches]
    return _nested(points, batches, batch_weights, weights[3] / real_c, top)


def _prompt_curve(shapes: Shapes, top: int, weights: Weights) -> Curve:
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
        query_weights = [sum(n for (q, _), n in mine.items() if q == v) * batch * weights[0] / real_t for v in query]
        inner = _nested(mine, query, query_weights, batch * weights[1] / real_c, top)
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
