"""Bucket count and padding waste per strategy for Llama-3.1-8B on Gaudi (max_model_len 8192).

Each bucket is one graph to compile at warm-up, so the count is the warm-up cost; the waste is
what the runtime pays instead. Traffic is synthetic and seeded: prompt lengths log-uniform, split
into chunks of at most max_num_batched_tokens (chunked prefill, so later chunks carry context);
decode steps with a uniform batch of sequences whose lengths are log-uniform.

    .venv/bin/python benchmarks/buckets.py
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install

from artifacts.buckets import build_bucket_set
from artifacts.limits import BucketSettings, ServingLimits
from artifacts.recipes import load_recipe

SEED = 0
PROMPTS = 2000
DECODE_STEPS = 2000
# recipes/llama3-8b.toml: max_model_len 8192, block 128, 128 seqs, 2048 batched tokens, and
# vllm-gaudi's defaults (prefix caching on, one prompt per prefill step).
LIMITS = load_recipe("llama3-8b").serving
# The same limits with ServingLimits' own defaults (prefill batch = max_num_seqs, prefix caching
# off, hence contiguous PA for decode).
PLAIN_LIMITS = LIMITS.model_copy(update={"max_num_prefill_seqs": None, "enable_prefix_caching": False})


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def prompt_shapes(rng: random.Random, limits: ServingLimits) -> list[tuple[int, int, int]]:
    """(batch, query, ctx_blocks) of every prefill chunk, one prompt per step."""
    shapes = []
    for _ in range(PROMPTS):
        length, done = log_uniform(rng, 16, limits.max_model_len - 256), 0
        while done < length:
            chunk = min(length - done, limits.max_num_batched_tokens)
            shapes.append((1, chunk, done // limits.block_size))
            done += chunk
    return shapes


def decode_shapes(rng: random.Random, limits: ServingLimits) -> list[tuple[int, int]]:
    """(batch, ctx_blocks) of decode steps: the block list holds every sequence's blocks."""
    shapes = []
    for _ in range(DECODE_STEPS):
        batch = rng.randint(1, limits.max_num_seqs)
        lengths = [log_uniform(rng, 16, limits.max_model_len) for _ in range(batch)]
        shapes.append((batch, sum(math.ceil(n / limits.block_size) for n in lengths)))
    return shapes


def main() -> None:
    rng = random.Random(SEED)
    prompts, decodes = prompt_shapes(rng, LIMITS), decode_shapes(rng, LIMITS)
    print(
        "llama3-8b: max_model_len 8192, block 128, max_num_seqs 128, max_num_batched_tokens 2048, "
        "prefill batch 1, prefix caching on"
    )
    print(f"traffic (seed {SEED}): {len(prompts)} prefill chunks from {PROMPTS} prompts, {len(decodes)} decode steps\n")
    header = (
        f"{'strategy':<12}{'prompt':>7}{'decode':>7}{'total':>7}  {'prefill waste':>13}"
        f"{'ctx waste':>10}  {'batch waste':>11}{'block waste':>12}  {'no bucket':>9}"
    )
    print(header)
    totals = {}
    for strategy in ("linear", "exponential"):
        buckets = build_bucket_set(LIMITS, BucketSettings(strategy=strategy))
        prompt, decode = buckets.padding("prompt", prompts), buckets.padding("decode", decodes)
        totals[strategy] = len(buckets.prompt) + len(buckets.decode)
        print(
            f"{strategy:<12}{len(buckets.prompt):>7}{len(buckets.decode):>7}{totals[strategy]:>7}  "
            f"{prompt.token_waste:>13.1%}{prompt.block_waste:>10.1%}  {decode.token_waste:>11.1%}"
            f"{decode.block_waste:>12.1%}  {prompt.unfitted + decode.unfitted:>9}"
        )
    ratio = totals["exponential"] / totals["linear"]
    print(
        f"\nexponential / linear bucket count: {ratio:.3f} ({1 - ratio:.0%} fewer graphs to warm up; "
        f"REFERENCE.md: up to 80%)"
    )
    recipe = {s: build_bucket_set(PLAIN_LIMITS, BucketSettings(strategy=s)) for s in ("linear", "exponential")}
    counts = ", ".join(f"{s} {len(b.prompt)} + {len(b.decode)}" for s, b in recipe.items())
    print(f"without vLLM's defaults (prefill batch 128, prefix caching off), prompt + decode: {counts}")


if __name__ == "__main__":
    main()
