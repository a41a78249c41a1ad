"""Step shapes compiled in worker processes (issue 36, item 4) give the package one process gives.

Two real AOTInductor builds of the same two-shape recipe, each in a fresh child over an emptied
Inductor cache folder (so neither reuses the other's kernels; the same path, since each .so names
its C++ sources by their absolute paths): one shape at a time, and two worker processes. Their packages hold the same models, constants and files, byte for byte: the parallel
build changes when each shape compiles, not what it compiles to (and two independent builds
agreeing is the determinism the bake's reproducibility relies on). Timing: benchmarks/bake_parallel.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.serving import write_recipe

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BUILD = """
import json, sys
from pathlib import Path
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import compile_graphs, model_and_cache
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import Tactic
recipe, out, workers = load_recipe(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
shapes = [StepShape("prefill", 1, 32, 32), StepShape("decode", 1, 1, 32)]
lines = []
compile_graphs(*model_and_cache(recipe, "fp32"), recipe, {s: Tactic() for s in shapes}, out, log=lines.append, workers=workers)
print("RESULT " + json.dumps(lines))
"""


def _build(root: Path, recipe: Path, workers: int) -> tuple[Path, list[str]]:
    out, cache = root / f"graphs-{workers}", root / "inductor"
    shutil.rmtree(cache, ignore_errors=True)  # nothing reused; one path, which every .so names its sources by
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(recipe), str(out), str(workers)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])
    return out, lines


def _contents(package: Path) -> dict[str, str]:
    with zipfile.ZipFile(package) as zf:
        return {name: hashlib.sha256(zf.read(name)).hexdigest() for name in zf.namelist()}


def test_two_workers_build_the_package_one_process_builds(tmp_path):
    write_recipe(tmp_path / "recipes", "workers-test", variant="aoti-package", seqs=1)
    recipe = tmp_path / "recipes" / "workers-test.toml"
    serial, serial_log = _build(tmp_path, recipe, 1)
    parallel, parallel_log = _build(tmp_path, recipe, 2)
    assert any("2 shapes in 2 worker processes" in line for line in parallel_log), parallel_log
    assert not any("worker" in line for line in serial_log), serial_log
    records = [json.loads((tree / "aoti" / "package.json").read_text()) for tree in (serial, parallel)]
    assert records[0]["models"] == records[1]["models"] and records[0]["constants"] == records[1]["constants"]
    assert _contents(serial / "aoti" / "steps.pt2") == _contents(parallel / "aoti" / "steps.pt2")
