"""Synthetic request traces of shapes other than the development trace, to check generalisation.

    chat        short prompts (lognormal, median about 120 tokens), medium outputs
    code        long prompts (lognormal, median about 3,000 tokens, up to the model length), short outputs
    chat-busy   shorter, wider prompts, longer outputs, twice chat's rate: decode batches near max_num_seqs
    chat-short  very short prompts and outputs
    code-long   longer code prompts (median about 4,000), very short outputs, a quiet server
    code-mid    mid-length prompts (median about 1,500), short outputs
    rag         prompts of a narrow length (median about 1,100: retrieved passages), medium outputs
    mixed       half chat, half code requests, interleaved

The first two back the tests; all of them back benchmarks/buckets.py's check on shapes the
fit never saw (fit on the first half of each, report on the second).

Seeded, so every run sees the same requests.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from prebake.artifacts.buckets.traces import Request

SHAPES = {
    "chat": {"prompt": (4.8, 0.8), "output": (5.0, 0.7), "rate": 6.0},
    "code": {"prompt": (8.0, 0.6), "output": (3.5, 0.8), "rate": 1.5},
    "chat-busy": {"prompt": (4.5, 1.0), "output": (5.5, 0.8), "rate": 12.0},
    "chat-short": {"prompt": (3.8, 0.7), "output": (4.5, 0.9), "rate": 4.0},
    "code-long": {"prompt": (8.3, 0.5), "output": (3.0, 1.0), "rate": 1.0},
    "code-mid": {"prompt": (7.3, 0.8), "output": (4.0, 0.8), "rate": 2.5},
    "rag": {"prompt": (7.0, 0.3), "output": (5.0, 0.5), "rate": 3.0},
}
MIXES = {"mixed": (("chat", "code"), 3.0)}  # kinds drawn evenly, at this rate


def synthetic_requests(kind: str, count: int, seed: int = 0, max_len: int = 8000) -> tuple[Request, ...]:
    kinds, rate = MIXES[kind] if kind in MIXES else ((kind,), SHAPES[kind]["rate"])
    rng = random.Random(seed)
    t, requests = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        shape = SHAPES[kinds[0] if len(kinds) == 1 else rng.choice(kinds)]
        prompt = min(max_len, max(1, int(rng.lognormvariate(*shape["prompt"]))))
        output = min(2048, max(1, int(rng.lognormvariate(*shape["output"]))))
        requests.append(Request(round(t, 4), prompt, output))
    return tuple(requests)


def write_jsonl(requests: tuple[Request, ...], path: Path) -> Path:
    lines = [
        json.dumps({"prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "arrival_s": r.arrival_s})
        for r in requests
    ]
    path.write_text("\n".join(lines) + "\n")
    return path
