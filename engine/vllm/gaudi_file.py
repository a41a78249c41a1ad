"""A bucket set as vllm-gaudi's VLLM_BUCKETING_FROM_FILE file, and upstream's reading of it.

The file holds one `(batch, query, ctx_blocks)` tuple a line; query 1 marks a decode bucket.
Upstream (vllm-gaudi 091bbad, bucketing/file_strategy.py and common.generate_buckets) reads it
with Python literals, where any element may also be a list or `range(a, b[, s])` (crossed), then
passes every bucket through its own filters and decode correction (bucket_rules.filter_prompt,
filter_decode). `upstream_reading` reimplements that reading, so a test can show that the file
prebake writes comes back as exactly the set it baked.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from prebake.artifacts.buckets.limits import ServingLimits
from prebake.artifacts.buckets.rules import UPSTREAM, Triple, filter_decode, filter_prompt
from prebake.artifacts.buckets.sets import BucketSet
from prebake.artifacts.errors import BucketError
from prebake.artifacts.fsutil import atomic_target

_RANGE = re.compile(r"range\(\s*(-?\d+)\s*,\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*)?\)")
_MOST_RANGE_ITEMS = 10000  # upstream leaves longer ranges unexpanded (and so skips the line)


def bucket_file_text(bucket_set: BucketSet) -> str:
    if any(b.query == 1 for b in bucket_set.prompt):
        raise BucketError(
            "a prompt bucket with query 1 would read back as a decode bucket in VLLM_BUCKETING_FROM_FILE; "
            "refit the set (traffic sets use queries of at least 2)"
        )
    lines = [f"# prebake {bucket_set.strategy} bucket set, block_size {bucket_set.block_size}; read by {UPSTREAM}"]
    lines += [f"({b.batch}, {b.query}, {b.ctx_blocks})" for b in bucket_set.prompt + bucket_set.decode]
    return "\n".join(lines) + "\n"


def write_bucket_file(bucket_set: BucketSet, path: Path) -> Path:
    with atomic_target(path) as tmp:
        tmp.write_text(bucket_file_text(bucket_set))
    return path


def parse_bucket_file(text: str) -> tuple[list[Triple], list[Triple]]:
    """Upstream's FileBucketingStrategy: (prompt, decode) buckets, sorted, bad lines skipped."""
    prompt: list[Triple] = []
    decode: list[Triple] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            bucket = ast.literal_eval(_RANGE.sub(_expand, line))
        except (ValueError, SyntaxError):
            continue
        if not isinstance(bucket, tuple) or len(bucket) != 3:
            continue
        for b, q, c in itertools.product(*(v if isinstance(v, list) else [v] for v in bucket)):
            (decode if int(q) == 1 else prompt).append((int(b), int(q), int(c)))
    return sorted(prompt), sorted(decode)


def _expand(match: re.Match[str]) -> str:
    start, stop = int(match.group(1)), int(match.group(2))
    step = int(match.group(3)) if match.group(3) else 1
    if step == 0:
        return match.group(0)
    count = max(0, (stop - start + (step - (1 if step > 0 else -1))) // step)
    return str(match.group(0)) if count > _MOST_RANGE_ITEMS else repr(list(range(start, stop, step)))


def upstream_reading(text: str, limits: ServingLimits) -> tuple[list[Triple], list[Triple]]:
    """The prompt and decode buckets vllm-gaudi warms up from this file under these limits."""
    prompt, decode = parse_bucket_file(text)
    contiguous = not limits.enable_prefix_caching
    return sorted(filter_prompt(prompt, limits)), sorted(filter_decode(decode, limits, contiguous))
