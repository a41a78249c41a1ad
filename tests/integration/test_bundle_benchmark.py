"""benchmarks/bundle.py, run small: it still measures every tree and operation, with verification
on, and its last line holds the figures the docs and notes compare over time (pack floors included)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TREES = ("inductor_cache", "files_512mb", "vllm_cuda")


def test_the_bundle_benchmark_ends_with_every_ratio_and_pack_floor(tmp_path):
    small = tmp_path / "cache"  # stands in for the Inductor cache, which takes a compile to make
    small.mkdir()
    for i in range(3):
        (small / f"f{i}").write_bytes(os.urandom(20_000))
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.bundle", "--scale", "0.01", "--repeat", "1", "--inductor-tree", str(small)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    lines = run.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    assert figures["verification"] is True and lines[0].startswith("verification on:")
    assert figures["cpus"] == os.cpu_count() and figures["sha256_gb_s"] > 0
    for tree in TREES:
        for op in ("pack", "unpack", "unpack_local"):
            assert figures[f"{op}_ratio_{tree}"] > 0
        assert figures[f"pack_floor_ratio_{tree}"] > 0
    assert sum(line.startswith("  pack floor") for line in lines) == len(TREES)
