"""Synthetic request traces of shapes other than the development trace, to check generalisation.

    chat   short prompts (lognormal, median about 120 tokens), medium outputs
    code   long prompts (lognormal, median about 3,000 tokens, up to the model length), short outputs

Seeded, so every run sees the same requests.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from artifacts.traces import Request

SHAPES = {
    "chat": {"prompt": (4.8, 0.8), "output": (5.0, 0.7), "rate": 6.0},
    "code": {"prompt": (8.0, 0.6), "output": (3.5, 0.8), "rate": 1.5},
}


def synthetic_requests(kind: str, count: int, seed: int = 0, max_len: int = 8000) -> tuple[Request, ...]:
    shape, rng = SHAPES[kind], random.Random(seed)
    t, requests = 0.0, []
    for _ in range(count):
        t += rng.expovariate(shape["rate"])
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
