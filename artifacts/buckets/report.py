"""How well a bucket set fits some traffic: counts and the four padding figures.

    prefill_tokens   1 - real / padded prefill query tokens (batch * query)
    prefill_ctx      1 - real / padded prefill context blocks (batch * ctx_blocks)
    decode_batch     1 - real / padded decode rows
    decode_blocks    1 - real / padded decode block-list entries
    unfitted         steps that found no bucket (they would compile on the fly)

The same figures back `prebake buckets` and benchmarks/buckets.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prebake.artifacts.buckets.artifact import build_bucket_set
from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.buckets.replay import Shapes
from prebake.artifacts.buckets.sets import BucketSet
from prebake.artifacts.errors import BucketError

Strategy = Literal["exponential", "linear", "pad", "traffic"]
STRATEGY_ORDER: tuple[Strategy, ...] = ("exponential", "linear", "pad", "traffic")


@dataclass(frozen=True)
class Figures:
    prompt: int
    decode: int
    prefill_tokens: float
    prefill_ctx: float
    decode_batch: float
    decode_blocks: float
    unfitted: int

    @property
    def total(self) -> int:
        return self.prompt + self.decode

    def to_json(self) -> dict[str, object]:
        waste = {
            "prefill_tokens": self.prefill_tokens,
            "prefill_ctx": self.prefill_ctx,
            "decode_batch": self.decode_batch,
            "decode_blocks": self.decode_blocks,
        }
        return {"prompt": self.prompt, "decode": self.decode, "waste": waste, "unfitted": self.unfitted}


def figures(bucket_set: BucketSet, shapes: Shapes) -> Figures:
    prompt = bucket_set.padding("prompt", shapes.prompt)
    decode = bucket_set.padding("decode", shapes.decode)
    return Figures(
        len(bucket_set.prompt),
        len(bucket_set.decode),
        round(prompt.token_waste, 6),
        round(prompt.block_waste, 6),
        round(decode.token_waste, 6),
        round(decode.block_waste, 6),
        prompt.unfitted + decode.unfitted,
    )


def strategy_set(
    strategy: Strategy,
    limits: ServingLimits,
    fit_shapes: Shapes | None,
    *,
    budget: int | None = None,
    max_waste: float | None = None,
) -> BucketSet:
    """vllm-gaudi's set for its strategies (default ranges); for traffic, the set fitted on fit_shapes."""
    if strategy != "traffic":
        return build_bucket_set(limits, BucketSettings(strategy=strategy))
    if fit_shapes is None:
        raise BucketError("a traffic set needs replayed shapes to fit on; pass a trace")
    from prebake.artifacts.buckets.traffic import fit_bucket_set, least_budget  # numpy: only for traffic

    if budget is None and max_waste is None:  # a third of exponential's count, or the least that works
        exponential = build_bucket_set(limits, BucketSettings())
        budget = max((len(exponential.prompt) + len(exponential.decode)) // 3, least_budget(limits, fit_shapes))
    return fit_bucket_set(limits, fit_shapes, budget=budget, max_waste=max_waste)
