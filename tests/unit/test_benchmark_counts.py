"""Every benchmark refuses a count of rounds that would time nothing, at once and naming the option,
instead of baking for minutes and then failing on a median of no rounds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.baking import REPO

COUNTS = {  # benchmark -> its count of rounds (engine/cli/common.positive_int)
    **dict.fromkeys(
        ["bake_parallel", "bundle", "decode", "fetch_stream", "fleet", "noop_bake", "oci_io", "registry_io"], "--repeat"
    ),
    **dict.fromkeys(["peers", "tp_bakes"], "--rounds"),
    "scale": "--iterations",
    "startup_vllm": "--runs",
    "registry_scale": "--lookups",
    "clients": "--requests",
    "serve_bodies": "--uploads",
    "serve_load": "--clients",
}
REQUIRED = {"tp_bakes": ["--recipes", "r", "--model", "m"]}


def _run(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *REQUIRED.get(name, []), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(COUNTS))
@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_count_that_times_nothing_is_refused_before_any_work(name, value):
    done = _run(name, COUNTS[name], value)
    assert done.returncode == 2 and f"argument {COUNTS[name]}: {value} must be 1 or more" in done.stderr, done.stderr


def test_startup_refuses_a_run_that_times_no_start_before_anything_is_baked():
    done = _run("startup", "--iterations", "0")
    assert done.returncode == 2 and "times no start" in done.stderr, done.stderr
