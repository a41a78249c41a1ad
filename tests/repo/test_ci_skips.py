"""Under CI=true a skip fails unless it is one of the legitimate ones, which docs/development.md lists."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.baking import REPO
from tests.support.ci_skips import LEGITIMATE

CASES = """
import pytest

def test_passes():
    pass

def test_reference_missing():
    pytest.skip("reference table /nowhere/table.json.gz is missing")

def test_own_module_broken():
    pytest.importorskip("prebake.no_such_module")

def test_cpu_lacks_an_instruction_set():
    pytest.skip("this CPU lacks AMX (amx_tile)")

def test_opt_in_vllm():
    pytest.skip("vllm is not importable; run make vllm-check")

@pytest.mark.xfail(reason="expected to fail")
def test_expected_failure():
    assert False
"""


def _outcomes(tmp_path, ci: str) -> dict[str, str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "tests.support.ci_skips", "-p", "no:cacheprovider"]
    done = subprocess.run([*argv, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    rows = re.findall(
        r"^(PASSED|FAILED|SKIPPED|XFAIL|ERROR)\S* .*?test_cases\.py(?::\d+)?(?:::(\w+))?", done.stdout, re.M
    )
    return {name or "?": status for status, name in rows} | {"rc": str(done.returncode), "out": done.stdout}


def test_under_ci_a_missing_reference_or_own_module_fails_and_the_opt_in_skip_stays(tmp_path):
    seen = _outcomes(tmp_path, "true")
    assert seen["test_reference_missing"] == "FAILED" and seen["test_own_module_broken"] == "FAILED", seen["out"]
    assert seen["test_passes"] == "PASSED" and seen["test_expected_failure"] == "XFAIL", seen["out"]
    assert "skipped under CI=true: " in seen["out"] and seen["rc"] == "1"
    assert "2 skipped" in seen["out"]  # the vllm one and the CPU's


def test_outside_ci_the_same_skips_are_skips(tmp_path):
    seen = _outcomes(tmp_path, "")
    assert seen["rc"] == "0" and "4 skipped" in seen["out"], seen["out"]


def test_every_legitimate_skip_is_listed_in_the_development_docs():
    text = (REPO / "docs" / "development.md").read_text()
    for pattern, why in LEGITIMATE:
        assert why in text, f"docs/development.md's table of skips lacks {pattern!r}: {why}"
