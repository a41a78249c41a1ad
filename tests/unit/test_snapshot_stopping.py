"""A restore's signals (snapshot/restore.Stopping), in a fresh process each: the operator's stop
before CRIU runs ends the start at once with 128 + the signal, as the default action did, and the
handlers the process had are back once the restore's part is over."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.support.baking import REPO


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_a_sigterm_before_criu_runs_ends_the_start_at_once_with_143():
    code = (
        "import os, signal, time\n"
        "from prebake.engine.bundled.snapshot.restore import Stopping\n"
        "with Stopping():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)  # a lookup or a download that would take this long\n"
        "print('not stopped')\n"
    )
    began = time.monotonic()
    done = _run(code)
    assert done.returncode == 128 + signal.SIGTERM and "not stopped" not in done.stdout, done.stdout + done.stderr
    assert time.monotonic() - began < 20


def test_the_handlers_the_process_had_are_back_after_the_restores_part():
    code = (
        "import signal\n"
        "from prebake.engine.bundled.snapshot.restore import Stopping\n"
        "mine = lambda signum, frame: None\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "interrupt = signal.getsignal(signal.SIGINT)  # Python's, or ignored where the parent ignores it\n"
        "with Stopping() as stopping:\n"
        "    inside = signal.getsignal(signal.SIGTERM)\n"
        "print(inside is not mine, signal.getsignal(signal.SIGTERM) is mine, signal.getsignal(signal.SIGINT) == interrupt, stopping.signal)\n"
    )
    done = _run(code)
    assert done.stdout.split() == ["True", "True", "True", "None"], done.stdout + done.stderr
