"""vLLM's process, started and stopped as the starter does: an engine that exits before it is ready
fails with the end of its log; stop ends the engine and the workers it started."""

import os
import subprocess
import sys

import pytest

from prebake.engine.common.adapter import EngineStartError
from prebake.engine.vllm.process import (
    Spawn,
    start,
    stop,
    wait_ready,
)
from tests.support.ports import free_port
from tests.support.vllm_hosts import STANDIN, standin_env
from tests.unit.test_probe import ended


def test_engine_that_exits_before_ready_fails_with_the_end_of_its_log(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    launch = Spawn(
        (sys.executable, str(STANDIN), "--model", "m", "--port", str(free_port())),
        standin_env(STANDIN_FAIL="ValueError: out of memory while profiling", VLLM_CACHE_ROOT=str(tmp_path / "c")),
        tmp_path,
        tmp_path / "log",
    )

    running = start(launch)
    with pytest.raises(
        EngineStartError, match="(?s)exited with 3 .*first errors:\n.*ValueError: out of memory while profiling"
    ):
        wait_ready(running, "http://127.0.0.1:1", timeout_s=60)


def test_stop_ends_the_engine_and_the_workers_it_started(tmp_path):
    script = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        "print('worker started', flush=True); time.sleep(300)"
    )
    running = start(Spawn((sys.executable, "-c", script), dict(os.environ), tmp_path, tmp_path / "log"))
    while "worker started" not in running.log.read_text():
        assert running.proc.poll() is None
    group = running.proc.pid

    stop(running, grace_s=0.5)

    members = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout.split()
    assert running.proc.returncode is not None
    assert all(ended(int(pid)) for pid in members)  # killed: gone, or a zombie waiting for its reaper
