"""benchmarks/fleet_fetch.py and benchmarks/oci_io.py, run small: they start their servers, run every
source, and end with one JSON line holding the figures docs/performance.md quotes."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("docker-registry") is None or shutil.which("skopeo") is None,
    reason="docker-registry and skopeo are needed (apt-get install; .ci/run does)",
)


def _figures(*argv: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_fleet_benchmark_measures_every_source_and_warm_or_preheated_mirrors_cost_the_origin_nothing():
    figures = _figures("benchmarks.fleet_fetch", "--nodes", "1,2", "--scale", "1")

    for source in ("s3", "oci", "mirror", "mirror_warm"):
        for n in (1, 2):
            assert (
                figures[f"{source}_n{n}_p50_s"] > 0
                and figures[f"{source}_n{n}_p99_s"] >= figures[f"{source}_n{n}_p50_s"]
            )
    assert figures["oci_n2_origin_blob_ratio_per_node"] == pytest.approx(1.0, abs=0.01)
    assert figures["mirror_warm_n2_origin_blob_bytes_per_node"] == 0, "a mirror that holds the bundle sends no blob"
    assert figures["preheated_n2_origin_blob_bytes_per_node"] == 0, "nodes after a preheat cost the origin no blob"
    assert figures["preheated_n2_preheat_origin_blob_ratio"] >= 1.0, "the preheat itself pulled the bundle"


def test_the_oci_io_benchmark_compares_fetch_and_publish_with_skopeo():
    figures = _figures("benchmarks.oci_io", "--size-mb", "2", "--repeat", "1")

    assert figures["oci_blob_mib"] == 2
    for op in ("fetch", "publish"):
        assert figures[f"oci_{op}_time_ratio_to_skopeo"] > 0
