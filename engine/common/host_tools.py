"""The host probe's device tools (nvidia-smi, hl-smi): found on the PATH it is given, run time-boxed
so that a hung tool never holds the probe, and read as CSV rows. An absent tool is no such device;
one that fails or hangs is the same plus a note (prebake.engine.common.probe reads the rows)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence

TOOL_TIMEOUT_S = 5.0
Runner = Callable[..., subprocess.CompletedProcess]  # subprocess.run's contract


def tool_rows(
    tool: str, args: Sequence[str], run: Runner, env: Mapping[str, str], notes: list[str]
) -> list[list[str]] | None:
    """The tool's CSV rows, or None when it is absent, fails, or hangs (with a note for the last two)."""
    exe = shutil.which(tool, path=env.get("PATH", os.defpath))
    if exe is None:
        return None
    try:
        done = run([exe, *args], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, env=dict(env))
    except subprocess.TimeoutExpired:
        notes.append(f"{tool} did not answer within {TOOL_TIMEOUT_S:g} s; assuming no such device")
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"{tool} could not run ({exc}); assuming no such device")
        return None
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip().splitlines()
        notes.append(f"{tool} exited {done.returncode} ({said[0] if said else 'no output'}); assuming no such device")
        return None
    return [[field.strip() for field in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def run_time_boxed(
    argv: Sequence[str], *, capture_output: bool, text: bool, timeout: float, env: Mapping[str, str]
) -> subprocess.CompletedProcess:
    """subprocess.run for the probe's tools, except that a timeout never waits on the tool.

    On timeout subprocess.run kills only the tool, not what it started, and then waits for it
    to exit, which a tool stuck in the kernel behind a GPU that fell off the bus may never do.
    Here the tool gets its own session, output goes to temporary files (nothing left running
    can hold a pipe open), and on timeout the whole session is killed and reaped in the
    background.
    """
    if not (capture_output and text):
        raise ValueError("the probe's runner only captures text output")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=dict(env), start_new_session=True
        )
        try:
            returncode = child.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            threading.Thread(target=child.wait, name=f"reap {argv[0]}", daemon=True).start()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            list(argv), returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace")
        )
