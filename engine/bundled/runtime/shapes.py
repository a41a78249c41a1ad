"""From bucket sets to the static step shapes the runtime compiles, and back for requests.

A bucket set follows vLLM on Gaudi (prebake.artifacts.buckets.artifact): a prefill bucket is (batch, query,
ctx_blocks) and a decode bucket is (batch, 1, ctx_blocks) where ctx_blocks counts the KV
blocks of the whole batch. The bundled runtime keeps one contiguous cache row per sequence,
so a decode bucket becomes a step in which each of `batch` rows attends over
ctx_blocks // batch blocks (capped at max_model_len). Several buckets can map to one step
shape; each step shape is compiled once. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from prebake.artifacts.buckets.artifact import Bucket, BucketSet


@dataclass(frozen=True, order=True)
class StepShape:
    """One static graph: a prefill of [batch, tokens] or a decode of [batch] over ctx_len positions."""

    phase: str  # "prefill" | "decode"
    batch: int
    tokens: int  # prefill: padded prompt length; decode: 1
    ctx_len: int  # decode: positions attended; prefill: equal to tokens

    @property
    def name(self) -> str:
        return f"{self.phase}-b{self.batch}-t{self.tokens}-c{self.ctx_len}"


def prefill_shape(bucket: Bucket) -> StepShape:
    return StepShape("prefill", bucket.batch, bucket.query, bucket.query)


def decode_shape(bucket: Bucket, block_size: int, max_model_len: int) -> StepShape:
    per_row = max(1, bucket.ctx_blocks // bucket.batch) * block_size
    return StepShape("decode", bucket.batch, 1, min(per_row, max_model_len))


def step_shapes(buckets: BucketSet, max_model_len: int) -> list[StepShape]:
    """Every distinct step shape of the bucket set: prompts without cached context, then decodes."""
    shapes = {prefill_shape(b) for b in buckets.prompt if b.ctx_blocks == 0 and b.query <= max_model_len}
    shapes |= {decode_shape(b, buckets.block_size, max_model_len) for b in buckets.decode}
    return sorted(shapes, key=lambda s: (s.phase != "prefill", s.batch, s.tokens, s.ctx_len))


def prefill_for(buckets: BucketSet, batch: int, longest_prompt: int) -> StepShape | None:
    """The smallest prefill step that holds `batch` prompts of up to `longest_prompt` tokens."""
    bucket = buckets.find_prompt(batch, longest_prompt, 0)
    return None if bucket is None else prefill_shape(bucket)


def decode_for(buckets: BucketSet, batch: int, longest_context: int, max_model_len: int) -> StepShape | None:
    """The smallest decode step for `batch` rows whose longest context is `longest_context` positions."""
    fitting = [
        shape
        for shape in (decode_shape(b, buckets.block_size, max_model_len) for b in buckets.decode)
        if shape.batch >= batch and shape.ctx_len >= longest_context
    ]
    # A bucket's per-row context shrinks as its batch grows, so the smallest bucket that holds
    # the request's blocks may not hold its longest row: pick the cheapest step that does.
    return min(fitting, key=lambda s: (s.batch * s.ctx_len, s.batch), default=None)
