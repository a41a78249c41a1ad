"""The GPU check's own machinery, for a lent GPU's few minutes: a host torch that lives in a venv of
its own is seen by the check's venv, and the steps run within a budget, each one's failure or
timeout recorded while the next still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv

import pytest

from benchmarks.gpu_check import Stages, _run, link_host_site


def test_a_host_site_in_a_venv_of_its_own_is_seen_by_the_checks_venv(tmp_path):
    # the CUDA images' torch lives in /opt/torch/.venv: a venv made from that venv's python reaches the
    # base interpreter's site-packages only, so without the .pth line it would not import torch at all
    host = tmp_path / "host-site"
    host.mkdir()
    (host / "host_only_module.py").write_text("WHERE = 'host'\n")
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    code = ["-c", "import host_only_module; print(host_only_module.WHERE)"]
    assert subprocess.run([str(python), *code], capture_output=True).returncode != 0
    pth = link_host_site(tmp_path / "venv", [str(host)])
    assert pth.read_text() == f"{host}\n"
    assert subprocess.run([str(python), *code], capture_output=True, text=True).stdout.strip() == "host"


def test_a_failed_step_is_recorded_and_the_next_one_still_runs(tmp_path):
    results = tmp_path / "results.jsonl"
    stages = Stages(None, results)

    def fails(timeout):
        _run([sys.executable, "-c", "import sys; print('the bake said this'); sys.exit(3)"], capture=True)

    stages.run("first", 0, fails)
    stages.run("second", 0, lambda timeout: {"ok": timeout is None})
    assert stages.failed == ["first"]
    assert (
        "failed (3)" in stages.figures["first"]["failed"] and "the bake said this" in stages.figures["first"]["failed"]
    )
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["first", "second"] and rows[1]["ok"] is True


def test_a_step_that_would_not_fit_the_budget_is_skipped_saying_so():
    stages = Stages(30, None)
    ran = []
    stages.run("big", 120, lambda timeout: ran.append(timeout) or {})
    stages.run("small", 5, lambda timeout: ran.append(timeout) or {})
    assert "this step needs about 120 s" in stages.figures["big"]["skipped"]
    assert len(ran) == 1 and 0 < ran[0] <= 30 and not stages.failed


def test_a_step_past_its_time_is_stopped_with_its_whole_process_group(tmp_path):
    child_pid = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    stages = Stages(None, None, step_s=3)
    stages.run("stuck", 0, lambda timeout: {"out": _run([sys.executable, "-c", script], capture=True, timeout=timeout)})
    assert stages.failed == ["stuck"] and "ran past its 3 s" in stages.figures["stuck"]["failed"]
    pid = int(child_pid.read_text())
    # the step's own child went with it, reaped by init or a zombie at most; a SIGKILL takes effect when
    # the process is next scheduled, which under CI's load was after the first look (CI of 12-06)
    deadline = time.monotonic() + 30
    with pytest.raises(ProcessLookupError):
        while time.monotonic() < deadline:
            _alive(pid)
            time.sleep(0.05)


def _alive(pid: int) -> None:
    """Raise ProcessLookupError unless `pid` runs (a zombie does not)."""
    stat = f"/proc/{pid}/stat"
    if not os.path.exists(stat) or open(stat).read().rsplit(")", 1)[-1].split()[0] == "Z":
        raise ProcessLookupError(pid)
