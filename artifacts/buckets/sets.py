"""Bucket sets as data: the padded shapes a server compiles once and reuses for every step.

A bucket is (batch, query, ctx_blocks). Prompt buckets pad a prefill step: `batch` prompts, each
`query` new tokens long, over `ctx_blocks` KV blocks already in the cache (earlier chunks of a
chunked prefill, or a prefix-cache hit). Decode buckets pad a decode step: query is 1 and
ctx_blocks is the length of the step's block list. A step runs in the first bucket (in sorted
order) that is >= it in every dimension, as vllm-gaudi looks them up; a step beyond every bucket
is compiled on the fly, which is what warm-up and a baked bucket set exist to avoid.

How sets are made lives elsewhere: bucket_rules (vllm-gaudi's strategies), traffic (fitted to a
trace); prebake.artifacts.buckets.artifact is the one entry point.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

from prebake.artifacts.errors import BucketError

Phase = Literal["prompt", "decode"]
FORMAT_VERSION = 1
STRATEGIES = ("exponential", "linear", "pad", "traffic")


@dataclass(frozen=True, order=True)
class Bucket:
    """One compiled shape. Ordered as vllm-gaudi sorts its tuples: batch, then query, then ctx."""

    batch: int
    query: int  # prompt: padded query length in tokens; decode: 1
    ctx_blocks: int  # prompt: context blocks per prompt; decode: length of the step's block list

    def holds(self, batch: int, query: int, ctx_blocks: int) -> bool:
        return self.batch >= batch and self.query >= query and self.ctx_blocks >= ctx_blocks


@dataclass(frozen=True)
class PaddingReport:
    """Real versus padded work for a list of step shapes run through one phase's buckets.

    Tokens are the query positions a step computes (prompt: batch * query; decode: batch).
    Blocks are the KV blocks it attends (prompt: batch * ctx_blocks; decode: ctx_blocks).
    Shapes that fit no bucket are counted in `unfitted` and left out of the sums.
    """

    phase: Phase
    fitted: int
    unfitted: int
    real_tokens: int
    padded_tokens: int
    real_blocks: int
    padded_blocks: int

    @property
    def token_waste(self) -> float:
        return _waste(self.real_tokens, self.padded_tokens)

    @property
    def block_waste(self) -> float:
        return _waste(self.real_blocks, self.padded_blocks)


def _waste(real: int, padded: int) -> float:
    return 1.0 - real / padded if padded else 0.0


@dataclass(frozen=True)
class BucketSet:
    """The prompt and decode buckets one serving configuration compiles, sorted."""

    strategy: str
    block_size: int
    prompt: tuple[Bucket, ...]
    decode: tuple[Bucket, ...]

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise BucketError(f"unknown bucket strategy {self.strategy!r}; use one of {STRATEGIES}")
        for phase in ("prompt", "decode"):
            rows = [(b.batch, b.query, b.ctx_blocks) for b in getattr(self, phase)]  # tuples: compared in C
            if any(later <= earlier for earlier, later in pairwise(rows)):  # strictly rising: sorted, unique
                raise BucketError(
                    f"{phase} buckets are not sorted and unique; build them with "
                    f"build_bucket_set or load them with BucketSet.from_json"
                )

    def find_prompt(self, batch: int, query: int, ctx_blocks: int = 0) -> Bucket | None:
        """The first bucket >= the prefill step in every dimension, None if none holds it."""
        return _first_holding(self.prompt, Bucket(batch, query, ctx_blocks))

    def find_decode(self, batch: int, ctx_blocks: int) -> Bucket | None:
        """The first bucket >= the decode step in every dimension, None if none holds it."""
        return _first_holding(self.decode, Bucket(batch, 1, ctx_blocks))

    def padding(self, phase: Phase, shapes: Iterable[Sequence[int]] | Mapping[tuple[int, ...], int]) -> PaddingReport:
        """Pad each step shape to its bucket and add up the work: prompt shapes are
        (batch, query, ctx_blocks), decode shapes are (batch, ctx_blocks). A mapping counts
        each shape as often as its value says."""
        width = {"prompt": 3, "decode": 2}[phase]
        fitted = unfitted = real_t = padded_t = real_b = padded_b = 0
        counted = shapes.items() if isinstance(shapes, Mapping) else ((shape, 1) for shape in shapes)
        for shape, n in counted:
            if len(shape) != width:
                raise BucketError(f"a {phase} shape has {width} numbers, got {tuple(shape)}")
            batch, query, ctx = shape if phase == "prompt" else (shape[0], 1, shape[1])
            bucket = _first_holding(getattr(self, phase), Bucket(batch, query, ctx))
            if bucket is None:
                unfitted += n
                continue
            fitted += n
            real_t, padded_t = real_t + n * batch * query, padded_t + n * bucket.batch * bucket.query
            if phase == "prompt":
                real_b, padded_b = real_b + n * batch * ctx, padded_b + n * bucket.batch * bucket.ctx_blocks
            else:
                real_b, padded_b = real_b + n * ctx, padded_b + n * bucket.ctx_blocks
        return PaddingReport(phase, fitted, unfitted, real_t, padded_t, real_b, padded_b)

    def to_json(self) -> dict[str, object]:
        return {
            "version": FORMAT_VERSION,
            "strategy": self.strategy,
            "block_size": self.block_size,
            "prompt": [[b.batch, b.query, b.ctx_blocks] for b in self.prompt],
            "decode": [[b.batch, b.query, b.ctx_blocks] for b in self.decode],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BucketSet:
        expected = {"version", "strategy", "block_size", "prompt", "decode"}
        if not isinstance(data, dict) or set(data) != expected:
            raise BucketError(
                f"a bucket set is a JSON object with exactly the keys {sorted(expected)}; "
                f"rebuild it with build_bucket_set"
            )
        if data["version"] != FORMAT_VERSION:
            raise BucketError(
                f"bucket set format version {data['version']!r} is not {FORMAT_VERSION}; rebuild it with this prebake"
            )
        if not _is_int(data["block_size"]) or data["block_size"] <= 0:
            raise BucketError(f"bucket set block_size {data['block_size']!r} is not a positive integer")
        return cls(
            data["strategy"],
            data["block_size"],
            _buckets_from_json("prompt", data["prompt"]),
            _buckets_from_json("decode", data["decode"]),
        )

    def digest(self) -> str:
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _buckets_from_json(phase: str, rows: object) -> tuple[Bucket, ...]:
    if not isinstance(rows, list):
        raise BucketError(f"bucket set {phase!r} is not a list of [batch, query, ctx_blocks]")
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and all(_is_int(v) and v >= 0 for v in row)):
            raise BucketError(
                f"bucket set {phase!r} holds {row!r}, not [batch, query, ctx_blocks] "
                f"of non-negative integers; rebuild it with build_bucket_set"
            )
    return tuple(Bucket(*row) for row in rows)


def _first_holding(buckets: tuple[Bucket, ...], want: Bucket) -> Bucket | None:
    # Every bucket that holds `want` sorts at or after it, so the scan can start there.
    for bucket in buckets[bisect.bisect_left(buckets, want) :]:
        if bucket.holds(want.batch, want.query, want.ctx_blocks):
            return bucket
    return None
