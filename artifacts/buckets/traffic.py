"""The traffic strategy: bucket sets fitted to a replayed trace, with every allowed shape covered.

    trace --replay--> step shapes with counts --fit--> fitted buckets + edges + cover -> BucketSet

Each phase is fitted on its own (threshold_fit.py), for every bucket count and weighting of its two
waste figures (report.py); with a budget, the set whose worst figure against the exponential
set's is least, an exact min-max; with max_waste, the fewest buckets under the bound. Cover
buckets leave no allowed step without a bucket, edge buckets climb from the busiest decode step
seen to the cover. Pure Python and numpy; the method, and why, in docs/buckets.md.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.buckets.replay import ReplaySettings, Shapes, replay
from prebake.artifacts.buckets.rules import device_blocks, upstream_set
from prebake.artifacts.buckets.sets import Bucket, BucketSet, Phase
from prebake.artifacts.buckets.threshold_fit import as_buckets, decode_curve, prompt_curve
from prebake.artifacts.buckets.traces import read_trace
from prebake.artifacts.errors import BucketError

MAX_FIT = 128  # most fitted buckets per phase (max_waste mode)
WEIGHTINGS = tuple(2.0**e for e in range(-6, 4))  # a phase's second figure's weight against its first
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
    # Each top both with no context and with the most: a step past what the fit saw pads its
    # context to the top only when it has some.
    prompt = {Bucket(b, q, ctx) for q, b in tops.items() for ctx in (0, top_ctx)}
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
    prompt, decode = _cover_and_edges(limits, shapes)
    return len(prompt) + len(decode) + 2


def _cover_and_edges(limits: ServingLimits, shapes: Shapes) -> tuple[set[Bucket], set[Bucket]]:
    prompt, decode = cover_buckets(limits)
    return prompt, decode | edge_buckets(limits, shapes)


def fit_bucket_set(
    limits: ServingLimits, shapes: Shapes, *, budget: int | None = None, max_waste: float | None = None
) -> BucketSet:
    """The bucket set of at most `budget` buckets whose worst figure against exponential's is
    least (or the smallest with every figure's padding under `max_waste`), cover included."""
    if (budget is None) == (max_waste is None):
        raise BucketError("fit a traffic set with exactly one of budget or max_waste")
    cover_prompt, cover_decode = _cover_and_edges(limits, shapes)
    floor = len(cover_prompt) + len(cover_decode)
    if budget is not None and budget < floor + 2:
        raise BucketError(
            f"budget {budget} is too small: these limits and this traffic need {floor} cover and edge "
            f"buckets plus at least one prompt and one decode bucket; raise budget to at least {floor + 2}"
        )
    room = MAX_FIT if budget is None else budget - floor
    prompt = _frontier("prompt", shapes, cover_prompt, room)
    decode = _frontier("decode", shapes, cover_decode, room)
    if budget is None:
        assert max_waste is not None  # one of the two was checked above
        chosen = (_least_under(prompt, max_waste, "prompt"), _least_under(decode, max_waste, "decode"))
    else:
        reference = np.maximum(_reference(limits, shapes), REFERENCE_FLOOR)
        chosen = _min_max(prompt, decode, reference, room)
    return BucketSet(
        "traffic",
        limits.block_size,
        tuple(sorted(cover_prompt | chosen[0].buckets)),
        tuple(sorted(cover_decode | chosen[1].buckets)),
    )


@dataclass(frozen=True)
class Option:
    """One fit of a phase: the buckets it adds to the cover and its two figures on the shapes."""

    count: int
    waste: tuple[float, float]
    buckets: frozenset[Bucket]


def _frontier(phase: Phase, shapes: Shapes, cover: set[Bucket], room: int) -> list[Option]:
    """Every distinct fit of up to `room` buckets the phase's curves give, one curve per weighting
    of its two figures, each measured exactly; the cover alone is one of them."""
    steps = _Steps(phase, shapes)
    options: dict[frozenset[Bucket], Option] = {frozenset(): Option(0, steps.waste(sorted(cover)), frozenset())}
    structures = (False, True) if phase == "prompt" else (False,)  # prompts: nested levels, then tiers
    for weighting, tiers in itertools.product(WEIGHTINGS, structures):
        if phase == "prompt":
            curve = prompt_curve(shapes, room, 1.0, weighting, tiers)
        else:
            curve = decode_curve(shapes, room, 1.0, weighting)
        for k in range(1, room + 1):
            if np.isfinite(curve.costs[k]):
                fitted = frozenset(as_buckets(phase, curve.pick(k))) - cover
                if fitted not in options:
                    options[fitted] = Option(len(fitted), steps.waste(sorted(fitted | cover)), fitted)
    return list(options.values())


class _Steps:
    """A phase's step shapes as arrays, to measure many bucket sets fast (first holding bucket)."""

    def __init__(self, phase: Phase, shapes: Shapes) -> None:
        if phase == "prompt":
            rows = [(b, q, c, n) for (b, q, c), n in shapes.prompt.items()]
        else:
            rows = [(b, 1, c, n) for (b, c), n in shapes.decode.items()]
        self.phase = phase
        self.batch, self.query, self.ctx, self.count = np.array(rows, dtype=np.float64).reshape(-1, 4).T

    def waste(self, buckets: list[Bucket]) -> tuple[float, float]:
        """The phase's two figures with these buckets (sorted): 1 - real / padded."""
        if not len(self.count):
            return 0.0, 0.0
        table = np.array([(b.batch, b.query, b.ctx_blocks) for b in buckets], dtype=np.float64)
        holds = (table[:, :1] >= self.batch) & (table[:, 1:2] >= self.query) & (table[:, 2:] >= self.ctx)
        if not holds.any(axis=0).all():
            raise BucketError("a replayed step has no bucket: the cover buckets do not match these limits")
        batch, query, ctx = table[holds.argmax(axis=0)].T
        n = self.count
        if self.phase == "prompt":
            pairs = ((self.batch * self.query, batch * query), (self.batch * self.ctx, batch * ctx))
        else:
            pairs = ((self.batch, batch), (self.ctx, ctx))
        first, second = (float(n @ padded) and 1.0 - float(n @ real) / float(n @ padded) for real, padded in pairs)
        return first, second


def _reference(limits: ServingLimits, shapes: Shapes) -> np.ndarray:
    """The default exponential set's four figures on these shapes."""
    exponential = upstream_set(limits, BucketSettings())
    prompt, decode = exponential.padding("prompt", shapes.prompt), exponential.padding("decode", shapes.decode)
    return np.array([prompt.token_waste, prompt.block_waste, decode.token_waste, decode.block_waste])


def _min_max(prompt: list[Option], decode: list[Option], reference: np.ndarray, room: int) -> tuple[Option, Option]:
    """The split of `room` buckets and the fit of each phase whose ratios to the reference, worst
    first, are lexicographically least (leximin: the least worst ratio, then the least second
    worst, and so on; then the fewest buckets). Per phase and count the leximin-best fit is kept,
    and the best of a union is the union of the bests, so this is exact over the frontiers."""
    prompt_best = _leximin_by_count(prompt, reference[:2], room)
    decode_best = _leximin_by_count(decode, reference[2:], room)
    splits = [(prompt_best[c], decode_best[room - c]) for c in range(room + 1)]
    (_, p), (_, d) = min(splits, key=lambda pd: (_worst_first(pd[0][0] + pd[1][0]), pd[0][1].count + pd[1][1].count))
    return p, d


def _leximin_by_count(
    options: list[Option], reference: np.ndarray, room: int
) -> list[tuple[tuple[float, ...], Option]]:
    """For each count up to `room`: the fit of at most that many buckets with the least ratios,
    worst first (and the ratios)."""
    keyed = sorted(
        ((tuple(np.round(np.asarray(o.waste) / reference, 12)), o) for o in options),
        key=lambda ro: (_worst_first(ro[0]), ro[1].count),
    )
    best: list[tuple[tuple[float, ...], Option]] = []
    for count in range(room + 1):
        best.append(next(ro for ro in keyed if ro[1].count <= count))  # the cover alone has count 0
    return best


def _worst_first(ratios: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(sorted(ratios, reverse=True))


def _least_under(options: list[Option], max_waste: float, phase: Phase) -> Option:
    under = [o for o in options if max(o.waste) <= max_waste]
    if not under:
        raise BucketError(
            f"no traffic set of up to {MAX_FIT} fitted {phase} buckets keeps padding under max_waste "
            f"{max_waste}; raise max_waste or set a budget instead"
        )
    return min(under, key=lambda o: (o.count, sum(o.waste)))
