"""vLLM-on-Gaudi's own bucket rules, reimplemented: the exponential, linear and pad strategies.

Followed from vllm-project/vllm-gaudi at the commit UPSTREAM names (its date: docs/buckets.md),
vllm_gaudi/extension/bucketing/ (exponential.py, linear.py, padding_aware.py,
common.py's cross product, edge buckets, filters and corrections); tests/unit/
test_bucket_conformance.py checks it against upstream's output for 126 cases.

    per-dimension configs  ->  ranges (exp | lin | pad)  ->  cross + edges  ->  filters, corrections

What is not modelled, and the older rules of bundles baked before: docs/buckets.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prebake.artifacts.buckets.limits import BucketRange, BucketSettings, ServingLimits
from prebake.artifacts.buckets.sets import Bucket, BucketSet
from prebake.artifacts.errors import BucketError

UPSTREAM = "vllm-project/vllm-gaudi@091bbadda10bee4fd3f6d0efc1844d2610dd2707 (2026-08-21)"
LONG_CONTEXT = 8192  # upstream's LONG_CTX_THRESHOLD: from here on, prompt ctx gets per-query edges
RANGE_FIELDS = ("prompt_bs", "prompt_seq", "prompt_ctx", "decode_bs", "decode_block")  # BucketSettings' ranges
Triple = tuple[int, int, int]


def linear_range(min: int, step: int, max: int) -> list[int]:
    """Upstream's linear range (`warmup_range`): double from min while below step, then every
    step up to max. A min of 0 ramps from step instead and puts 0 back."""
    _check(min <= max, f"linear range min {min} exceeds max {max}; lower min or raise max")
    if min == 0 and max == 0:
        return [0]
    low = step if min == 0 else min
    ramp, value = [], low
    while value < step and value <= max:
        ramp.append(value)
        value *= 2
    values = [v for v in ramp + list(range(step, max + 1, step)) if v >= low]
    return sorted(values + [0] if min == 0 else values)


def exponential_range(min: int, step: int, max: int, limit: int, exact_top: bool = False) -> list[int]:
    """Upstream's exponential range (`warmup_range_with_limit`): `limit` points spaced
    geometrically from min to max, rounded up to multiples of step, deduplicated, the last clamped
    to max. A min of 0 or 1 is spaced from step and added back. With contiguous PA upstream puts
    the last point at max exactly (`exact_top`)."""
    _check(limit >= 1, f"exponential range limit {limit} must be at least 1")
    if limit == 1:
        return [max]
    low = step if min in (0, 1) else min
    values = set()
    for i in range(limit):
        if i == limit - 1 and exact_top:
            values.add(max)
        else:  # the same float expression as upstream, so rounding lands on the same multiples
            values.add(math.ceil(low * (max / low) ** ((1.0 / float(limit - 1)) * i) / step) * step)
    if min in (0, 1):
        values.add(min)
    ordered = sorted(values)
    if ordered[-1] > max:
        ordered[-1] = max
    return ordered


def padded_range(min: int, step: int, max: int, pad_max: int, pad_percent: int) -> list[int]:
    """Upstream's pad range (`warmup_range_with_limits`): double from min up to step, then walk
    in steps and keep a value when skipping it would pad more than `pad_max` positions or more
    than `pad_percent`% of the next value, or when it is a multiple of pad_max; max always ends it."""
    _check(min <= max, f"pad range min {min} exceeds max {max}; lower min or raise max")
    _check(step > 0, f"pad range step {step} must be positive")
    _check(0 <= pad_percent <= 50, f"pad_percent {pad_percent} must be between 0 and 50")
    pad_max = pad_max or max
    values, current = [min], min
    while current <= max:
        last = values[-1]
        if current <= step:
            upcoming = last * 2 or 1
            if upcoming <= max:
                values.append(upcoming)
        else:
            upcoming = current + step
            padding = upcoming - last - 1
            keep = padding / upcoming > pad_percent / 100.0 or padding > pad_max or current % pad_max == 0
            if keep and current != last:
                values.append(current)
        current = upcoming
    if values[-1] != max:
        values.append(max)
    return values


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise BucketError(message)


@dataclass(frozen=True)
class RuleRanges:
    """What upstream derives before crossing: one range per dimension and the switches it reads."""

    prompt_bs: list[int]
    prompt_query: list[int]
    prompt_ctx: list[int]
    decode_bs: list[int]
    decode_block: list[int]
    contiguous_pa: bool
    prompt_ctx_env_max: int | None  # VLLM_PROMPT_CTX_BUCKET_MAX as upstream sees it


def device_blocks(limits: ServingLimits) -> int:
    """The KV block count upstream is given (num_hpu_blocks). Without one we take a cache that
    holds every sequence at full length."""
    return limits.num_device_blocks or math.ceil(limits.max_model_len / limits.block_size) * limits.max_num_seqs


def configs(limits: ServingLimits, settings: BucketSettings) -> dict[str, tuple[int, ...]]:
    """Upstream's per-dimension configs for the strategy: (min, step, max[, limit | pad_max,
    pad_percent]), defaults first, then the recipe's overrides (linear and pad only)."""
    strategy = settings.strategy
    if strategy == "exponential":
        return _exponential_configs(limits)
    block, tokens, seqs, blocks = (
        limits.block_size,
        limits.max_num_batched_tokens,
        limits.max_num_seqs,
        device_blocks(limits),
    )
    contiguous = not limits.enable_prefix_caching
    pad = strategy == "pad"

    def pick(field: str, default: tuple[int, ...]) -> list[int]:
        given: BucketRange | None = getattr(settings, field)
        if given is None:
            return list(default)
        extra = [default[3] if given.pad_max is None else given.pad_max] if pad else []
        extra += [default[4] if given.pad_percent is None else given.pad_percent] if pad else []
        return [given.min, given.step, given.max, *extra]

    def dflt(min: int, step: int, max: int, pad_max: int) -> tuple[int, ...]:
        return (min, step, max, pad_max, 25) if pad else (min, step, max)

    query = pick("prompt_seq", dflt(block, block, tokens, math.ceil(tokens / 4)))
    max_ctx = (
        math.ceil((limits.max_model_len - query[0]) / block) if pad else (limits.max_model_len - query[0]) // block
    )
    if pad:
        max_decode = max(math.ceil(limits.max_model_len * seqs / block), block)
    else:
        max_decode = max(limits.max_model_len * seqs // block, block)
    max_decode = blocks if contiguous else max_decode
    decode_block = pick("decode_block", dflt(block if pad else 1, block, max_decode, math.ceil(max_decode / 4)))
    if (contiguous or not pad) and decode_block[2] > blocks:
        # Upstream clamps only with contiguous PA; for linear, vllm_gaudi_env passes a decode block
        # max no larger than the device's block count (prebake's choice: no bucket the cache cannot fill).
        decode_block[2] = blocks
    if decode_block[0] > (blocks if pad else decode_block[2]):
        decode_block[0] = max(1, (blocks if pad else decode_block[2]) - decode_block[1])
    return {
        "prompt_bs": tuple(pick("prompt_bs", dflt(1, 1, limits.prefill_seqs, math.ceil(limits.prefill_seqs / 4)))),
        "prompt_seq": tuple(query),
        "prompt_ctx": tuple(pick("prompt_ctx", dflt(0, 2 if pad else 1, max_ctx, math.ceil(tokens / block)))),
        "decode_bs": tuple(pick("decode_bs", dflt(1, 2 if pad else 32, seqs, math.ceil(seqs / 4)))),
        "decode_block": tuple(decode_block),
    }


def _exponential_configs(limits: ServingLimits) -> dict[str, tuple[int, ...]]:
    block, tokens, seqs, prefill = (
        limits.block_size,
        limits.max_num_batched_tokens,
        limits.max_num_seqs,
        limits.prefill_seqs,
    )
    reserved = tokens if limits.max_model_len >= LONG_CONTEXT else block
    max_ctx = max(1, (limits.max_model_len - reserved) // block)
    max_decode = math.ceil(limits.max_model_len / block) * seqs
    blocks = device_blocks(limits)
    max_decode = min(blocks, max_decode) if not limits.enable_prefix_caching else min(max_decode, blocks * 3)
    return {
        "prompt_bs": (1, 2, prefill, _log2_limit(prefill)),
        "prompt_seq": (block, block, tokens, math.ceil(math.log2(tokens))),
        "prompt_ctx": (0, 1, max_ctx, 2 if max_ctx == 1 else _log2_limit(max_ctx)),
        "decode_bs": (1, 2, seqs, _log2_limit(seqs)),
        "decode_block": (1, seqs, max_decode, _log2_limit(max_decode)),
    }


def _log2_limit(top: int) -> int:
    return math.ceil(math.log2(top)) + 1


def derive_ranges(limits: ServingLimits, settings: BucketSettings) -> RuleRanges:
    """Every range upstream builds for these limits, strategy and overrides."""
    contiguous = not limits.enable_prefix_caching
    cfgs = configs(limits, settings)
    ranges = {field: _range(settings.strategy, field, cfg, contiguous) for field, cfg in cfgs.items()}
    if contiguous and ranges["decode_block"][-1] < device_blocks(limits):
        ranges["decode_block"] = ranges["decode_block"] + [device_blocks(limits)]
    ctx_env_max = _ctx_env_max(settings, cfgs)
    return RuleRanges(
        contiguous_pa=contiguous, prompt_ctx_env_max=ctx_env_max, **{_PLAN_FIELD[f]: r for f, r in ranges.items()}
    )


_PLAN_FIELD = {f: f for f in RANGE_FIELDS} | {"prompt_seq": "prompt_query"}


def _ctx_env_max(settings: BucketSettings, cfgs: dict[str, tuple[int, ...]]) -> int | None:
    # vllm_gaudi_env sets every linear range, so upstream sees VLLM_PROMPT_CTX_BUCKET_MAX there;
    # pad passes only the recipe's overrides.
    if settings.strategy == "linear":
        return cfgs["prompt_ctx"][2]
    if settings.strategy == "pad" and settings.prompt_ctx is not None:
        return settings.prompt_ctx.max
    return None


def _range(strategy: str, field: str, cfg: tuple[int, ...], contiguous: bool) -> list[int]:
    try:
        if strategy == "exponential":
            low, step, high, limit = cfg
            return exponential_range(low, step, high, limit, exact_top=contiguous)
        if strategy == "pad":
            return padded_range(*cfg)
        return linear_range(*cfg)
    except BucketError as error:
        raise BucketError(f"{field}: {error}") from None


def upstream_set(limits: ServingLimits, settings: BucketSettings) -> BucketSet:
    """The set vllm-gaudi builds for a strategy of its own (exponential, linear, pad)."""
    rules = derive_ranges(limits, settings)
    prompt = tuple(Bucket(*b) for b in prompt_buckets(rules, limits))
    decode = tuple(Bucket(*b) for b in decode_buckets(rules, limits))
    return BucketSet(settings.strategy, limits.block_size, prompt, decode)


def prompt_buckets(plan: RuleRanges, limits: ServingLimits) -> list[Triple]:
    """Cross the prompt ranges, add the long-context edges, keep what upstream's filters keep.

    From LONG_CONTEXT on, the top ctx value becomes, per query, the most context that query can
    still have, (max_model_len - query) // block, unless VLLM_PROMPT_CTX_BUCKET_MAX forbids it;
    then the previous query's ctx carries over, as upstream's loop does.
    """
    mml, block = limits.max_model_len, limits.block_size
    top_ctx, edges = max(plan.prompt_ctx), mml >= LONG_CONTEXT
    kept = set()
    for batch in plan.prompt_bs:
        for planned in plan.prompt_ctx:
            ctx = planned
            for query in plan.prompt_query:
                if edges and planned == top_ctx:
                    edge = (mml - query) // block
                    if edge >= 0 and (plan.prompt_ctx_env_max is None or edge < plan.prompt_ctx_env_max):
                        ctx = edge
                kept.add((batch, query, ctx))
    return _nonempty("prompt", filter_prompt(kept, limits))


def decode_buckets(plan: RuleRanges, limits: ServingLimits) -> list[Triple]:
    crossed = {(batch, 1, blocks) for batch in plan.decode_bs for blocks in plan.decode_block}
    return _nonempty("decode", filter_decode(crossed, limits, plan.contiguous_pa))


def filter_prompt(buckets: Iterable[Triple], limits: ServingLimits) -> set[Triple]:
    """Upstream's prompt filters (no merged prefill); they apply to file buckets too."""
    max_ctx = math.ceil((limits.max_model_len - 1) / limits.block_size)
    return {
        (b, q, c)
        for b, q, c in buckets
        if c <= max_ctx and q <= limits.max_model_len and b * q <= limits.max_num_batched_tokens
    }


def filter_decode(buckets: Iterable[Triple], limits: ServingLimits, contiguous_pa: bool) -> set[Triple]:
    """Upstream's decode rules: with contiguous PA every bucket stays as it is; otherwise a batch
    needs one block per sequence and never more blocks than every sequence at max_model_len."""
    if contiguous_pa:
        return set(buckets)
    per_seq = math.ceil(limits.max_model_len / limits.block_size)
    return {(b, q, min(c, b * per_seq)) for b, q, c in buckets if b <= c}


def _nonempty(phase: str, kept: set[Triple]) -> list[Triple]:
    if not kept:
        raise BucketError(
            f"no {phase} bucket survives vllm-gaudi's filters (max_model_len, max_num_batched_tokens, "
            f"one block per sequence); widen the {phase} ranges or raise the serving limits"
        )
    return sorted(kept)
