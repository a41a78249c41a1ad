"""Request traces: arrival time, prompt length and output length of each request.

Two formats, told apart by the file's suffix:

    .csv    the Azure LLM inference trace: TIMESTAMP (ISO date-time), ContextTokens, GeneratedTokens
    .jsonl  one object a line: {"prompt_tokens": n, "output_tokens": m} with optional "arrival_s"
            (seconds; without it requests arrive together at 0, for a closed-loop replay) and
            optional "cached_tokens" (a prefix-cache hit)

Every bad line is an error naming the file, the line and what is wrong.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from prebake.artifacts.errors import BucketError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0


def read_trace(path: Path) -> tuple[Request, ...]:
    """Requests in arrival order (ties keep file order), arrivals relative to the first."""
    path = Path(path)
    readers = {".csv": _read_azure_csv, ".jsonl": _read_jsonl}
    if path.suffix not in readers:
        raise BucketError(f"trace {path} is neither .csv (Azure LLM trace) nor .jsonl; rename it or convert it")
    try:
        requests = readers[path.suffix](path)
    except OSError as exc:
        raise BucketError(f"cannot read trace {path}: {exc.strerror}; check buckets.trace") from exc
    if not requests:
        raise BucketError(f"trace {path} holds no requests; fit on a trace with at least one")
    start = min(r.arrival_s for r in requests)
    ordered = sorted(enumerate(requests), key=lambda ir: (ir[1].arrival_s, ir[0]))
    return tuple(Request(r.arrival_s - start, r.prompt_tokens, r.output_tokens, r.cached_tokens) for _, r in ordered)


def split_trace(requests: tuple[Request, ...]) -> tuple[tuple[Request, ...], tuple[Request, ...]]:
    """First and second half by arrival: fit on one, report on the other."""
    half = len(requests) // 2
    second = requests[half:]
    start = second[0].arrival_s if second else 0.0
    return requests[:half], tuple(
        Request(r.arrival_s - start, r.prompt_tokens, r.output_tokens, r.cached_tokens) for r in second
    )


def _read_azure_csv(path: Path) -> list[Request]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise BucketError(
                f"trace {path} lacks the Azure trace columns {missing}; its header must hold {AZURE_COLUMNS}"
            )
        return [_azure_row(path, n, row) for n, row in enumerate(reader, start=2)]


def _azure_row(path: Path, line: int, row: dict[str, str]) -> Request:
    try:
        stamp = datetime.fromisoformat(_trim_fraction(row["TIMESTAMP"].strip()))
        prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
    except (ValueError, TypeError) as exc:
        raise BucketError(f"{path} line {line}: {exc}; expected a date-time and two token counts") from None
    return _request(path, line, stamp.timestamp(), prompt, output, 0)


def _trim_fraction(stamp: str) -> str:
    # The Azure trace writes 7 fractional digits; Python's parser takes at most 6.
    head, dot, fraction = stamp.partition(".")
    return f"{head}.{fraction[:6]}" if dot else head


def _read_jsonl(path: Path) -> list[Request]:
    requests = []
    with path.open() as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BucketError(f"{path} line {line_no} is not JSON ({exc.msg}); one object a line") from None
            requests.append(_jsonl_row(path, line_no, row))
    return requests


def _jsonl_row(path: Path, line: int, row: object) -> Request:
    known = {"prompt_tokens", "output_tokens", "arrival_s", "cached_tokens"}
    if not isinstance(row, dict) or not {"prompt_tokens", "output_tokens"} <= set(row) or set(row) - known:
        raise BucketError(
            f"{path} line {line}: expected {{'prompt_tokens': n, 'output_tokens': m}} with optional "
            f"'arrival_s' and 'cached_tokens', got {row!r}"
        )
    values = [row["prompt_tokens"], row["output_tokens"], row.get("cached_tokens", 0)]
    arrival = row.get("arrival_s", 0.0)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values) or not isinstance(arrival, int | float):
        raise BucketError(f"{path} line {line}: token counts must be integers and arrival_s a number, got {row!r}")
    return _request(path, line, float(arrival), *values)


def _request(path: Path, line: int, arrival: float, prompt: int, output: int, cached: int) -> Request:
    if prompt < 1 or output < 0 or not 0 <= cached < prompt:
        raise BucketError(
            f"{path} line {line}: prompt_tokens must be >= 1, output_tokens >= 0 and 0 <= cached_tokens < "
            f"prompt_tokens (got {prompt}, {output}, {cached})"
        )
    return Request(arrival, prompt, output, cached)
