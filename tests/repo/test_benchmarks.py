"""Every benchmark script is checked like the package: mypy reads benchmarks/ (pyproject.toml), and
each answers --help in a subprocess without importing torch, so a rename in prebake breaks the suite, not the next
measurement (issue 49 item 10: startup_vllm.py imported a class renamed a pass earlier)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

from tests.support.baking import REPO

BENCHMARKS = sorted((REPO / "benchmarks").glob("*.py"))
# Runs a script as __main__ with --help, then says whether torch was imported (import-time work stays
# light: a heavy import belongs in the function that measures, not at the top of the script).
_HELP = (
    "import runpy, sys\n"
    "sys.argv = [sys.argv[1], '--help']\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except SystemExit as exit:\n"
    "    assert exit.code in (0, None), exit.code\n"
    "print('torch imported:', 'torch' in sys.modules)\n"
)


def test_mypy_checks_every_benchmark_script():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "benchmarks" in config["files"], "mypy's files must list benchmarks/"
    assert config.get("explicit_package_bases"), "benchmarks/x.py must be checked as benchmarks.x, as it is imported"


def test_every_benchmark_answers_help_without_heavy_imports():
    assert len(BENCHMARKS) >= 20, f"benchmarks/ holds {len(BENCHMARKS)} scripts: the glob found the wrong folder"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    running = {
        script.name: subprocess.Popen(
            [sys.executable, "-c", _HELP, str(script)],
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
        elif "torch imported: True" in out:
            failed[name] = (
                "imports torch before it parses its arguments: move the import into the function that needs it"
            )
    assert not failed, "benchmarks that do not answer --help:\n" + "\n".join(f"{n}: {e}" for n, e in failed.items())
