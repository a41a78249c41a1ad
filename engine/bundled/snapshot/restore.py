"""Restoring a parked process (prebake.engine.bundled.parked) from a snapshot's tree, and supervising it while it serves.

    check      the files it maps are this host's (files.py); the temporary ones put back (image.py)
    restore    `unshare -pf --mount-proc --kill-child criu restore -D images --inherit-fd ...`:
               a new PID namespace (the process keeps the PID it had at the bake, free there), its
               output and control pipes replaced by two this process made, no terminal
    hand over  one JSON line on the control pipe: host, port, API key, limits, when the start began
    ready      its output relayed line by line; its ready line ends the restore
    serve      relayed until it exits; this process's SIGTERM or exit closes the control pipe, which
               stops it (prebake.engine.bundled.parked): it never outlives its supervisor
A failure before ready is a value (`Failed` with CRIU's own error lines): the caller starts the
engine the usual way in the same call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prebake.artifacts.errors import ExitCode
from prebake.engine.bundled.snapshot.host import Able
from prebake.engine.bundled.snapshot.image import EXIT_PREFIX, SnapshotInfo

READY_PREFIX = "prebake serve: ready:"
RESTORE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Failed:
    reason: str


@dataclass
class Restored:
    """A restored server: its supervisor's handle (stop it with `stop`, wait with `wait`)."""

    proc: subprocess.Popen
    control: int
    relay: threading.Thread
    ready_line: str
    exits: list[int] = field(default_factory=list)  # the code its EXIT_PREFIX line said, once it said it
    emit: Callable[[str], None] = print

    def wait(self) -> int:
        """Its exit code, as its last line says it: `criu restore` exits 0 however the restored
        process ended (a SIGILL or SIGSEGV included), so a server that ended without that line is
        reported, with ExitCode.FAILED."""
        criu = self.proc.wait()
        self.relay.join(5)
        if self.exits:
            return self.exits[-1]
        self.emit(
            f"prebake serve: snapshot: the restored server ended without saying how (criu restore exited {criu}): "
            f"a signal killed it (SIGILL, SIGSEGV, the OOM killer's SIGKILL) or an error its last lines above name"
        )
        return ExitCode.FAILED

    def stop(self) -> None:
        try:
            os.close(self.control)  # the restored process stops on EOF (prebake.engine.bundled.parked)
        except OSError:
            pass


class Stopping:
    """SIGTERM and SIGINT from a restore's start to its server's end (`with Stopping() as stopping`):
    before CRIU runs, SystemExit(128 + the signal); a restore under way is killed; a restored server
    is stopped (its control pipe closed); `signal` says the operator asked this start to stop (no
    usual start after it). Before, a signal between the ready line and the supervision killed
    `prebake serve` by default and left the restored server to stop unsupervised, its streamed entry
    never installed (docs/snapshots.md, "Stopped as it restores")."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._proc: subprocess.Popen | None = None
        self._restored: Restored | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Stopping:
        if threading.current_thread() is threading.main_thread():  # where Python runs signal handlers
            self._previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal returned

    def started(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        if self.signal is not None:
            _kill(proc)

    def serve(self, restored: Restored) -> int:
        """The restored server's exit code once it ended; stopped at once where a signal came first."""
        self._restored = restored
        if self.signal is not None:
            restored.stop()
        return restored.wait()

    def _stop(self, signum: int, frame: object) -> None:
        self.signal = signum
        if self._restored is not None:
            self._restored.stop()
        elif self._proc is not None:
            _kill(self._proc)
        else:  # nothing of the restore runs yet (a lookup, a download): stop now, the with-blocks undone
            raise SystemExit(128 + signum)


def restore(
    images: Path,
    info: SnapshotInfo,
    able: Able,
    settings: Mapping[str, object],
    work: Path,
    emit: Callable[[str], None],
    *,
    streamed: bool = False,
    started: Callable[[subprocess.Popen], None] = lambda proc: None,
) -> Restored | Failed:
    """Restore the snapshot whose CRIU images are in `images` (`streamed`: served on its socket by
    stream.py) into a new PID namespace and hand it `settings`; `work` keeps CRIU's log; `started`
    is told of the restore's process as it starts. Restored once its ready line came, else Failed
    with why."""
    out_r, out_w = os.pipe()
    control_r, control_w = os.pipe()
    command = [
        str(able.unshare), "--pid", "--fork", "--mount-proc", "--kill-child",
        str(able.criu), "restore", "-D", str(images), "-W", str(work), "-o", "restore.log", "-v2",
        *(["--stream"] if streamed else []),
        "--inherit-fd", f"fd[{out_w}]:{info.output_pipe}",
        "--inherit-fd", f"fd[{control_r}]:{info.control_pipe}",
    ]  # fmt: skip
    stops = {signal.SIGTERM, signal.SIGINT}
    held = signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # held until `started` knows the process:
    try:  # a stop in between would leave it running; unshare and CRIU inherit the mask (SIGKILL ends them)
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=out_w,
            pass_fds=(out_w, control_r),
            start_new_session=True,
        )
        started(proc)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    os.close(out_w)
    os.close(control_r)
    try:
        os.write(control_w, (json.dumps(dict(settings)) + "\n").encode())
    except BrokenPipeError:  # the restore ended (failed, or was killed by a stop) before it read them
        pass  # its end of output and its exit status say why, below
    reader = os.fdopen(out_r, "rb", buffering=0)
    ready = _until_ready(reader, proc, emit)
    if isinstance(ready, Failed):
        os.close(control_w)
        _end(proc)
        reader.close()
        return Failed(f"{ready.reason}{_criu_errors(work / 'restore.log')}")
    exits: list[int] = []
    relay = threading.Thread(target=_relay, args=(reader, emit, exits), name="prebake-snapshot-relay", daemon=True)
    relay.start()
    return Restored(proc, control_w, relay, ready, exits, emit)


def _until_ready(reader, proc: subprocess.Popen, emit: Callable[[str], None]) -> str | Failed:
    deadline = time.monotonic() + RESTORE_TIMEOUT_S
    timer = threading.Timer(RESTORE_TIMEOUT_S, lambda: _end(proc))
    timer.start()
    try:
        for raw in iter(reader.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            emit(line)
            if line.startswith(READY_PREFIX):
                return line
        code = proc.wait()
        late = time.monotonic() > deadline
        return Failed(
            f"the restore {'ran past ' + str(RESTORE_TIMEOUT_S) + ' s' if late else f'exited {code}'} before it was ready"
        )
    finally:
        timer.cancel()


def _relay(reader, emit: Callable[[str], None], exits: list[int]) -> None:
    for raw in iter(reader.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        code = line.removeprefix(EXIT_PREFIX)
        if code != line and code.lstrip("-").isdigit():
            exits.append(int(code))
            continue
        emit(line)
    reader.close()


def _end(proc: subprocess.Popen) -> None:
    """Kill the restore: unshare's --kill-child takes CRIU, the PID namespace's init, and with it
    every process restored in it."""
    if proc.poll() is None:
        _kill(proc)
    proc.wait()


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: start_new_session
    except ProcessLookupError:
        pass


def _criu_errors(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.strip() for line in lines if "Error" in line][-3:]
    return f": {' | '.join(errors)} (the full log: {log})" if errors else f" (CRIU's log: {log})"
