"""Conformance: prebake's exponential, linear and pad sets equal vllm-gaudi's own output.

The table (shared/reference-data beside the checkout, or $PREBAKE_BUCKET_REFERENCE) holds
upstream's sets for 126 cases, produced by running vllm-gaudi 091bbad's bucketing modules
unchanged. Every case must match; none is excused. Without the table the module skips, and under
CI=true that skip fails (tests/support/ci_skips.py).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

from prebake.artifacts.buckets.artifact import build_bucket_set
from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.errors import BucketError
from prebake.engine.vllm.gaudi import vllm_gaudi_env
from tests.support.baking import SHARED

TABLE = Path(
    os.environ.get("PREBAKE_BUCKET_REFERENCE", SHARED / "reference-data" / "vllm-gaudi-091bbad-buckets.json.gz")
)
STRATEGY = {"exp": "exponential", "lin": "linear", "pad": "pad"}


def _cases() -> list[dict]:
    if not TABLE.exists():
        return []
    return json.loads(gzip.decompress(TABLE.read_bytes()))["cases"]


CASES = _cases()
BIG = 100_000  # cases whose upstream sets hold more buckets than this take seconds each: marked slow


def _param(case: dict):
    size = sum(int(case.get(f"{phase}_count") or 0) for phase in ("prompt", "decode"))
    marks = [pytest.mark.slow] if size > BIG else []
    return pytest.param(case, marks=marks, id=f"{case['label']}-{case['strategy']}")


PARAMS = [_param(c) for c in CASES]
pytestmark = pytest.mark.skipif(not CASES, reason=f"reference table {TABLE} is missing")


def _rows(buckets) -> list[list[int]]:
    return [[b.batch, b.query, b.ctx_blocks] for b in buckets]


def _same(phase: str, ours: list[list[int]], case: dict) -> bool:
    want = case[phase]
    if isinstance(want, list):
        return ours == want
    canonical = json.dumps(ours, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return len(ours) == case[f"{phase}_count"] and digest == case[f"{phase}_sha256"]


def _limits(case: dict) -> ServingLimits:
    limits = dict(case["limits"])
    limits.setdefault("num_device_blocks", case["num_hpu_blocks"])
    return ServingLimits(**limits)


@pytest.mark.parametrize("case", PARAMS)
def test_bucket_set_matches_vllm_gaudi(case):
    settings = BucketSettings(strategy=STRATEGY[case["strategy"]])
    limits = _limits(case)
    if isinstance(case["prompt"], str) and case["prompt"].startswith("ERR"):
        with pytest.raises(BucketError):
            build_bucket_set(limits, settings)
        return
    ours = build_bucket_set(limits, settings)
    assert _same("prompt", _rows(ours.prompt), case)
    assert _same("decode", _rows(ours.decode), case)


@pytest.mark.parametrize("case", PARAMS)
def test_environment_is_the_one_upstream_ran_with(case):
    env = vllm_gaudi_env(_limits(case), BucketSettings(strategy=STRATEGY[case["strategy"]]))
    assert {k: v for k, v in env.items() if k in case["env"]} == case["env"]
