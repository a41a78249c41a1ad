"""Every benchmark script is checked like the package: mypy reads benchmarks/ (pyproject.toml), and
each answers --help in a subprocess, quickly, so a rename in prebake breaks the suite, not the next
measurement (issue 49 item 10: startup_vllm.py imported a class renamed a pass earlier)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib

from tests.support.baking import REPO

BENCHMARKS = sorted((REPO / "benchmarks").glob("*.py"))
HELP_BUDGET_S = 15.0  # all of them at once, on a loaded two-core machine; each takes well under 1 s quiet


def test_mypy_checks_every_benchmark_script():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "benchmarks" in config["files"], "mypy's files must list benchmarks/"
    assert config.get("explicit_package_bases"), "benchmarks/x.py must be checked as benchmarks.x, as it is imported"


def test_every_benchmark_answers_help_without_heavy_imports():
    assert len(BENCHMARKS) >= 20, f"benchmarks/ holds {len(BENCHMARKS)} scripts: the glob found the wrong folder"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    running = {
        script.name: subprocess.Popen(
            [sys.executable, str(script), "--help"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for script in BENCHMARKS
    }
    failed = {}
    for name, proc in running.items():
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0 or not out.strip():
            failed[name] = f"exit {proc.returncode}: {out[-1500:]}"
    seconds = time.monotonic() - started
    assert not failed, "benchmarks that do not answer --help:\n" + "\n".join(f"{n}: {e}" for n, e in failed.items())
    assert seconds < HELP_BUDGET_S, (
        f"--help of {len(running)} scripts took {seconds:.1f} s: keep import-time work light"
    )
