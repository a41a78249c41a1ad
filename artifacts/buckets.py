"""Shape buckets: the padded shapes a Gaudi server compiles once and reuses for every request.

A bucket is (batch, query, ctx_blocks). Prompt buckets pad a prefill step: `batch` prompts, each
`query` new tokens long, over `ctx_blocks` KV blocks already in the cache (earlier chunks of a
chunked prefill, or a prefix-cache hit). Decode buckets pad a decode step: query is 1 and
ctx_blocks is the length of the step's block list. A step runs in the first bucket that is >= it
in every dimension; a step beyond every bucket is compiled on the fly, which is what warm-up and
a baked bucket set exist to avoid.

Each dimension gets a range of values from a strategy, the ranges are crossed, and filters drop
shapes the server can never see:

    ranges (linear | exponential)  ->  cross product  ->  filters, corrections  ->  BucketSet

This reproduces vllm-gaudi (github.com/vllm-project/vllm-gaudi) exactly, as read in its
vllm_gaudi/extension/ sources: bucketing/linear.py (`warmup_range`, `read_bucket_settings` with
VLLM_PROMPT_QUERY_* names), bucketing/exponential.py (`warmup_range_with_limit`, LONG_CTX_THRESHOLD,
decode block max `min(max_model_len // block_size * max_num_seqs, blocks * max_num_seqs // 4)`),
bucketing/common.py (`generate_buckets` with long-context edge buckets and the exp|lin|pad
VLLM_BUCKETING_STRATEGY switch), features.py (`use_contiguous_pa` defaults to "prefix caching off")
and v1/worker/hpu_model_runner.py (prefill batch = VLLM_PROMPT_BS_BUCKET_MAX, default 1). Newer
upstream unit tests show the exponential decode block max moving again (a 3x-physical-blocks floor
and a limit capped at max(6, batch limit)); that source was not readable, so it is not followed.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .errors import BucketError
from .limits import BucketRange, BucketSettings, ServingLimits

Phase = Literal["prompt", "decode"]
FORMAT_VERSION = 1
LONG_CONTEXT = 8192  # vllm-gaudi's LONG_CTX_THRESHOLD: from here on, prompt ctx is planned per query
STRATEGIES = ("exponential", "linear")
# BucketSettings field -> the vllm-gaudi variable prefix that sets the same range.
RANGE_VARIABLES = {
    "prompt_bs": "VLLM_PROMPT_BS",
    "prompt_seq": "VLLM_PROMPT_QUERY",  # VLLM_PROMPT_SEQ_* is the deprecated fallback name
    "prompt_ctx": "VLLM_PROMPT_CTX",
    "decode_bs": "VLLM_DECODE_BS",
    "decode_block": "VLLM_DECODE_BLOCK",
}


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
            buckets = getattr(self, phase)
            if list(buckets) != sorted(set(buckets)):
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

    def padding(self, phase: Phase, shapes: Iterable[Sequence[int]]) -> PaddingReport:
        """Pad each step shape to its bucket and add up the work: prompt shapes are
        (batch, query, ctx_blocks), decode shapes are (batch, ctx_blocks)."""
        width = {"prompt": 3, "decode": 2}[phase]
        fitted = unfitted = real_t = padded_t = real_b = padded_b = 0
        for shape in shapes:
            if len(shape) != width:
                raise BucketError(f"a {phase} shape has {width} numbers, got {tuple(shape)}")
            batch, query, ctx = shape if phase == "prompt" else (shape[0], 1, shape[1])
            bucket = _first_holding(getattr(self, phase), Bucket(batch, query, ctx))
            if bucket is None:
                unfitted += 1
                continue
            fitted += 1
            real_t, padded_t = real_t + batch * query, padded_t + bucket.batch * bucket.query
            if phase == "prompt":
                real_b, padded_b = real_b + batch * ctx, padded_b + bucket.batch * bucket.ctx_blocks
            else:
                real_b, padded_b = real_b + ctx, padded_b + bucket.ctx_blocks
        return PaddingReport(phase, fitted, unfitted, real_t, padded_t, real_b, padded_b)

    def to_json(self) -> dict:
        return {
            "version": FORMAT_VERSION,
            "strategy": self.strategy,
            "block_size": self.block_size,
            "prompt": [[b.batch, b.query, b.ctx_blocks] for b in self.prompt],
            "decode": [[b.batch, b.query, b.ctx_blocks] for b in self.decode],
        }

    @classmethod
    def from_json(cls, data: dict) -> BucketSet:
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


def linear_range(min: int, step: int, max: int) -> list[int]:
    """vllm-gaudi's linear range: double from min while below step, then every step up to max.

    A min of 0 ramps from step instead and puts 0 back: (0, 32, 128) -> [0, 32, 64, 96, 128].
    """
    _check_range(min, step, max)
    low = step if min == 0 else min
    if low > max:
        raise BucketError(
            f"linear range ({min}, {step}, {max}) starts at {low}, above its max; "
            f"raise max to at least {low} or lower step"
        )
    ramp = []
    value = low
    while value < step and value <= max:
        ramp.append(value)
        value *= 2
    values = [v for v in ramp + list(range(step, max + 1, step)) if v >= low]
    return sorted(values + [0] if min == 0 else values)


def exponential_range(min: int, step: int, max: int, limit: int) -> list[int]:
    """vllm-gaudi's exponential range: `limit` points spaced geometrically from min to max,
    each rounded up to a multiple of step, duplicates dropped, the last clamped to max.

    A min of 0 or 1 is spaced from step instead and added back as its own bucket.
    """
    _check_range(min, step, max)
    if limit < 1:
        raise BucketError(f"exponential range limit {limit} must be at least 1")
    if min > max:
        raise BucketError(f"exponential range min {min} exceeds max {max}; lower min or raise max")
    if limit == 1:
        return [max]
    low = step if min in (0, 1) else min
    # Same float expression as upstream, so the rounding lands on the same multiples of step.
    exponents = [(1.0 / float(limit - 1)) * i for i in range(limit)]
    values = {math.ceil(low * (max / low) ** e / step) * step for e in exponents}
    if min in (0, 1):
        values.add(min)
    ordered = sorted(values)
    ordered[-1] = ordered[-1] if ordered[-1] <= max else max
    return ordered


def _check_range(min: int, step: int, max: int) -> None:
    if not all(_is_int(v) for v in (min, step, max)) or min < 0 or step < 1 or max < 1:
        raise BucketError(
            f"bucket range ({min!r}, {step!r}, {max!r}) needs integers with min >= 0, step >= 1 and max >= 1"
        )


@dataclass(frozen=True)
class _Plan:
    """Everything vllm-gaudi derives before crossing: one range per dimension and the switches."""

    prompt_bs: list[int]
    prompt_query: list[int]
    prompt_ctx: list[int]
    decode_bs: list[int]
    decode_block: list[int]
    contiguous_pa: bool
    prompt_ctx_env_max: int | None  # VLLM_PROMPT_CTX_BUCKET_MAX as vllm-gaudi would see it


def build_bucket_set(limits: ServingLimits, settings: BucketSettings) -> BucketSet:
    """The buckets vllm-gaudi builds for these limits with this strategy and these ranges."""
    _check_overrides(limits, settings)
    plan = _exponential_plan(limits) if settings.strategy == "exponential" else _linear_plan(limits, settings)
    return BucketSet(settings.strategy, limits.block_size, _prompt_buckets(plan, limits), _decode_buckets(plan, limits))


def vllm_gaudi_env(limits: ServingLimits, settings: BucketSettings) -> dict[str, str]:
    """The environment that makes vllm-gaudi build the same buckets as build_bucket_set.

    The caller hands it to the server process; nothing here touches os.environ. The exponential
    strategy takes no ranges, only the prefill batch (which vllm-gaudi reads from
    VLLM_PROMPT_BS_BUCKET_MAX); its decode blocks follow the device's KV block count, so pass
    limits.num_device_blocks for an exact match.
    """
    _check_overrides(limits, settings)
    exponential = settings.strategy == "exponential"
    env = {
        "VLLM_BUCKETING_STRATEGY": "exp" if exponential else "lin",
        # Deprecated but still read, and it wins over VLLM_BUCKETING_STRATEGY when set.
        "VLLM_EXPONENTIAL_BUCKETING": "true" if exponential else "false",
        "VLLM_CONTIGUOUS_PA": "false" if limits.enable_prefix_caching else "true",
    }
    if exponential:
        return env | {"VLLM_PROMPT_BS_BUCKET_MAX": str(limits.prefill_seqs)}
    for field, config in _linear_configs(limits, settings).items():
        for name, value in zip(("MIN", "STEP", "MAX"), config):
            env[f"{RANGE_VARIABLES[field]}_BUCKET_{name}"] = str(value)
    return env


def _check_overrides(limits: ServingLimits, settings: BucketSettings) -> None:
    given = [field for field in RANGE_VARIABLES if getattr(settings, field) is not None]
    if settings.strategy == "exponential" and given:
        raise BucketError(
            f"bucket ranges {given} have no effect with strategy 'exponential': "
            f"vllm-gaudi ignores VLLM_*_BUCKET_* ranges there; remove them, set "
            f"strategy = 'linear', or set max_num_prefill_seqs for the prompt batch"
        )
    ceilings = {
        "prompt_bs": ("max_num_prefill_seqs", limits.prefill_seqs),
        "decode_bs": ("max_num_seqs", limits.max_num_seqs),
    }
    for field, (limit_name, ceiling) in ceilings.items():
        override = getattr(settings, field)
        if override is not None and override.max > ceiling:
            raise BucketError(
                f"{field}.max ({override.max}) exceeds {limit_name} ({ceiling}): the "
                f"server never runs such a batch; lower {field}.max to {ceiling}"
            )


def _device_blocks(limits: ServingLimits) -> int:
    # vllm-gaudi always knows its KV block count (profiled before bucketing). Without it we take
    # a cache that holds every sequence at full length, the decode maximum its docs give.
    per_seq = math.ceil(limits.max_model_len / limits.block_size)
    return limits.num_device_blocks or per_seq * limits.max_num_seqs


def _linear_configs(limits: ServingLimits, settings: BucketSettings) -> dict[str, tuple[int, int, int]]:
    """vllm-gaudi's linear (min, step, max) per dimension: the defaults, then the overrides."""
    block, blocks = limits.block_size, _device_blocks(limits)

    def pick(field: str, default: tuple[int, int, int]) -> tuple[int, int, int]:
        override: BucketRange | None = getattr(settings, field)
        return default if override is None else (override.min, override.step, override.max)

    query = pick("prompt_seq", (block, block, limits.max_num_batched_tokens))
    decode_max = max(limits.max_model_len * limits.max_num_seqs // block, block)
    if not limits.enable_prefix_caching:  # contiguous PA: one block id range for the whole step
        decode_max = blocks
    decode_block = pick("decode_block", (1, block, decode_max))
    return {
        "prompt_bs": pick("prompt_bs", (1, 1, limits.prefill_seqs)),
        "prompt_seq": query,
        "prompt_ctx": pick("prompt_ctx", (0, 1, (limits.max_model_len - query[0]) // block)),
        "decode_bs": pick("decode_bs", (1, 32, limits.max_num_seqs)),
        "decode_block": (decode_block[0], decode_block[1], min(decode_block[2], blocks)),
    }


def _linear_plan(limits: ServingLimits, settings: BucketSettings) -> _Plan:
    configs = _linear_configs(limits, settings)
    ranges = {field: _named(field, linear_range, *config) for field, config in configs.items()}
    contiguous = not limits.enable_prefix_caching
    decode_block = ranges["decode_block"]
    if contiguous and decode_block[-1] < _device_blocks(limits):
        decode_block = decode_block + [_device_blocks(limits)]
    # vllm_gaudi_env always sets VLLM_PROMPT_CTX_BUCKET_MAX for linear, so vllm-gaudi sees it.
    return _Plan(
        ranges["prompt_bs"],
        ranges["prompt_seq"],
        ranges["prompt_ctx"],
        ranges["decode_bs"],
        decode_block,
        contiguous,
        configs["prompt_ctx"][2],
    )


def _exponential_plan(limits: ServingLimits) -> _Plan:
    """vllm-gaudi's exponential (min, step, max, limit) per dimension; it takes no overrides."""
    block, seqs, tokens = limits.block_size, limits.max_num_seqs, limits.max_num_batched_tokens
    prefill, blocks = limits.prefill_seqs, _device_blocks(limits)
    # Long contexts leave the top ctx bucket to the per-query edge buckets (see _prompt_buckets).
    reserved = tokens if limits.max_model_len >= LONG_CONTEXT else block
    max_ctx = max(1, (limits.max_model_len - reserved) // block)
    contiguous = not limits.enable_prefix_caching
    decode_max = blocks if contiguous else min(limits.max_model_len // block * seqs, blocks * seqs // 4)
    return _Plan(
        prompt_bs=_named("prompt_bs", exponential_range, 1, 2, prefill, _log2_limit(prefill)),
        prompt_query=_named("prompt_seq", exponential_range, block, block, tokens, math.ceil(math.log2(tokens))),
        prompt_ctx=_named("prompt_ctx", exponential_range, 0, 1, max_ctx, 2 if max_ctx == 1 else _log2_limit(max_ctx)),
        decode_bs=_named("decode_bs", exponential_range, 1, 2, seqs, _log2_limit(seqs)),
        decode_block=_named("decode_block", exponential_range, 1, seqs, decode_max, _log2_limit(blocks)),
        contiguous_pa=contiguous,
        prompt_ctx_env_max=None,
    )


def _log2_limit(top: int) -> int:
    return math.ceil(math.log2(top)) + 1


def _named(field: str, make_range: Callable[..., list[int]], *config: int) -> list[int]:
    try:
        return make_range(*config)
    except BucketError as error:
        raise BucketError(f"{field} ({RANGE_VARIABLES[field]}_BUCKET_*): {error}") from None


def _prompt_buckets(plan: _Plan, limits: ServingLimits) -> tuple[Bucket, ...]:
    """Cross the prompt ranges; keep shapes within max_model_len and the token budget.

    From LONG_CONTEXT on, the top ctx bucket becomes, per query, the most context that query
    can still have: (max_model_len - query) // block_size, unless VLLM_PROMPT_CTX_BUCKET_MAX
    forbids it, in which case the previous query's ctx carries over (as upstream does).
    """
    mml, block = limits.max_model_len, limits.block_size
    top_ctx, edge_buckets = max(plan.prompt_ctx), mml >= LONG_CONTEXT
    kept = set()
    for batch in plan.prompt_bs:
        for planned_ctx in plan.prompt_ctx:
            ctx = planned_ctx
            for query in plan.prompt_query:
                if edge_buckets and planned_ctx == top_ctx:
                    edge = (mml - query) // block
                    if edge >= 0 and (plan.prompt_ctx_env_max is None or edge < plan.prompt_ctx_env_max):
                        ctx = edge
                if query + ctx * block <= mml and batch * query <= limits.max_num_batched_tokens:
                    kept.add(Bucket(batch, query, ctx))
    return _nonempty("prompt", kept)


def _decode_buckets(plan: _Plan, limits: ServingLimits) -> tuple[Bucket, ...]:
    """Cross the decode ranges. With contiguous PA every pair stays; otherwise a batch needs at
    least one block per sequence and never more than every sequence at max_model_len."""
    per_seq = math.ceil(limits.max_model_len / limits.block_size)
    kept = set()
    for batch in plan.decode_bs:
        for blocks in plan.decode_block:
            if plan.contiguous_pa:
                kept.add(Bucket(batch, 1, blocks))
            elif batch <= blocks:
                kept.add(Bucket(batch, 1, min(blocks, batch * per_seq)))
    return _nonempty("decode", kept)


def _nonempty(phase: str, kept: set[Bucket]) -> tuple[Bucket, ...]:
    if not kept:
        raise BucketError(
            f"no {phase} bucket survives the filters (max_model_len, "
            f"max_num_batched_tokens, one block per sequence); widen the {phase} "
            f"ranges or raise the serving limits"
        )
    return tuple(sorted(kept))
