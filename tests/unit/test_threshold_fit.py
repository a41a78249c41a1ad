"""The threshold DPs' costs are the padding vllm-gaudi's first-holding lookup really gives: for
every bucket count, the buckets a curve picks, measured by BucketSet.padding, cost what the
curve says, for both prompt structures (nested levels and context tiers) and for decode."""

from __future__ import annotations

import random

import numpy as np
import pytest

from prebake.artifacts.buckets.replay import Shapes
from prebake.artifacts.buckets.sets import BucketSet
from prebake.artifacts.buckets.threshold_fit import as_buckets, decode_curve, prompt_curve


def random_shapes(seed: int) -> Shapes:
    rng = random.Random(seed)
    prompt: dict[tuple[int, int, int], int] = {}
    for _ in range(60):
        shape = (rng.choice([1, 1, 2]), rng.randint(2, 400), rng.choice([0, 0, 0, 4, 8, 12, rng.randint(0, 20)]))
        prompt[shape] = prompt.get(shape, 0) + rng.randint(1, 9)
    decode: dict[tuple[int, int], int] = {}
    for _ in range(60):
        batch = rng.randint(1, 16)
        shape = (batch, rng.randint(batch, batch * 8))
        decode[shape] = decode.get(shape, 0) + rng.randint(1, 9)
    return Shapes(prompt, decode)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("tiers", [False, True])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 0.125), (1.0, 4.0)])
def test_prompt_curve_costs_are_the_real_padding(seed, tiers, weights):
    shapes = random_shapes(seed)
    curve = prompt_curve(shapes, 24, *weights, tiers=tiers)
    real_t = sum(n * b * q for (b, q, _), n in shapes.prompt.items())
    real_c = sum(n * b * c for (b, _, c), n in shapes.prompt.items())
    checked = 0
    for k in range(1, 25):
        if not np.isfinite(curve.costs[k]):
            continue
        buckets = as_buckets("prompt", curve.pick(k))
        assert len(buckets) <= k
        report = BucketSet("traffic", 16, tuple(sorted(buckets)), ()).padding("prompt", shapes.prompt)
        assert report.unfitted == 0
        cost = weights[0] * report.padded_tokens / real_t + weights[1] * report.padded_blocks / real_c
        assert cost == pytest.approx(curve.costs[k], rel=1e-9)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("seed", [1, 2])
def test_decode_curve_costs_are_the_real_padding(seed):
    shapes = random_shapes(seed)
    curve = decode_curve(shapes, 20, 1.0, 0.5)
    real_b = sum(n * b for (b, _), n in shapes.decode.items())
    real_c = sum(n * c for (_, c), n in shapes.decode.items())
    for k in range(1, 21):
        if np.isfinite(curve.costs[k]):
            buckets = as_buckets("decode", curve.pick(k))
            report = BucketSet("traffic", 16, (), tuple(sorted(buckets))).padding("decode", shapes.decode)
            assert report.unfitted == 0
            cost = report.padded_tokens / real_b + 0.5 * report.padded_blocks / real_c
            assert cost == pytest.approx(curve.costs[k], rel=1e-9)


def test_more_buckets_never_cost_more():
    curve = prompt_curve(random_shapes(4), 30, 1.0, 1.0, tiers=True)
    finite = curve.costs[np.isfinite(curve.costs)]
    assert (np.diff(finite) <= 1e-12).all()
