"""Every benchmark refuses a count of rounds that would time nothing, at once and naming the option,
instead of baking for minutes and then failing on a median of no rounds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.baking import REPO

CASES = [
    ("startup", ["--iterations", "0"], "times no start"),
    ("bake_parallel", ["--repeat", "0"], "--repeat 0: give 1 or more"),
    ("bundle", ["--repeat", "0"], "--repeat 0: give 1 or more"),
    ("decode", ["--repeat", "0"], "--repeat 0: give 1 or more"),
    ("fetch_stream", ["--repeat", "0"], "--repeat 0: give 1 or more"),
    ("fleet", ["--repeat", "-2"], "--repeat -2: give 1 or more"),
    ("noop_bake", ["--repeat", "0"], "--repeat 0: give 1 or more"),
    ("oci_io", ["--repeat", "0"], "--repeat 0: give 1 or more"),
    ("peers", ["--rounds", "0"], "--rounds 0: give 1 or more"),
    ("registry_io", ["--repeat", "0"], "--repeat 0: give 1 or more"),
    ("scale", ["--iterations", "0"], "--iterations 0: give 1 or more"),
    ("startup_vllm", ["--runs", "0"], "--runs 0: give 1 or more"),
    ("tp_bakes", ["--recipes", "r", "--model", "m", "--rounds", "0"], "--rounds 0: give 1 or more"),
    ("registry_scale", ["--lookups", "0"], "--lookups 0: give 1 or more"),
    ("clients", ["--requests", "0"], "--requests 0: give 1 or more"),
    ("serve_bodies", ["--uploads", "0"], "--uploads 0: give 1 or more"),
    ("serve_load", ["--clients", "0"], "--clients 0: give 1 or more"),
]


@pytest.mark.parametrize(("name", "args", "said"), CASES, ids=[c[0] for c in CASES])
def test_a_count_that_times_nothing_is_refused_before_any_work(name, args, said, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and said in done.stderr, done.stderr[-2000:]
