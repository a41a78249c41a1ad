"""The bake's snapshot step: start the parked process (prebake.engine.bundled.parked), record what it maps, dump it.

spawn      `prebake serve --park` (prebake.engine.bundled.parked), in its own session, stdin /dev/null,
           stdout+stderr one pipe (relayed to the bake's log), CONTROL_FD the read end of another
parked     on READY_LINE: its mapped and open files recorded (image.py), the temporary ones copied
dump       `criu dump -t PID -D images`: the process is stopped and its memory written; it exits;
           its pages images moved to streamed/ (image.py: last in the bundle, for a streamed restore)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from prebake.artifacts.errors import BuildError
from prebake.engine.bundled.snapshot import files
from prebake.engine.bundled.snapshot.host import Able, key_factors
from prebake.engine.bundled.snapshot.image import (
    CARRIED_DIR,
    CONTROL_FD,
    FORMAT,
    IMAGES_DIR,
    READY_LINE,
    SnapshotInfo,
    carried_path,
    move_streamed,
)

PARK_TIMEOUT_S = 900.0


def dump(
    spec: Mapping[str, str],
    out: Path,
    able: Able,
    env: Mapping[str, str],
    emit: Callable[[str], None],
    cache: Path,
    weights: Callable[[], Sequence[str]] = tuple,
) -> SnapshotInfo:
    """Start the engine from `spec` (model, precision), park it, and dump it into `out`; `weights`:
    the files recorded beside the ones it maps (the model's, mapped or copied into its memory), asked
    once it is parked (its start may have written them)."""
    control_r, control_w = os.pipe()
    command = [sys.executable, "-m", "prebake.engine.cli", "serve", "--park", "--on-miss", "fail"]
    command += ["--model", spec["model"], "--precision", spec["precision"], "--registry-timeout", "60"]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        pass_fds=(CONTROL_FD,),  # dup2-ed there by preexec_fn, which runs before the other fds close
        preexec_fn=lambda: os.dup2(control_r, CONTROL_FD),
        start_new_session=True,
        cwd="/",
    )
    os.close(control_r)
    try:
        _wait_parked(proc, emit)
        info = _record(proc.pid, out, able, files.DigestCache(cache), weights())
        _criu_dump(able, proc, out)
        move_streamed(out)
        return info
    finally:
        os.close(control_w)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _wait_parked(proc: subprocess.Popen, emit: Callable[[str], None]) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + PARK_TIMEOUT_S
    tail: list[str] = []
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        if line == READY_LINE:
            return
        emit(f"  {line}")
        tail = [*tail[-19:], line]
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise BuildError(
        f"the snapshot's process exited (or ran past {PARK_TIMEOUT_S:.0f} s) before it was warm "
        f"(exit {proc.wait()}); its output is above; nothing was published"
    )


def _record(pid: int, out: Path, able: Able, cache: files.DigestCache, weights: Sequence[str]) -> SnapshotInfo:
    if deleted := files.deleted_mappings(pid):
        raise BuildError(
            f"the snapshot's process maps deleted files ({', '.join(deleted[:3])}); nothing to restore from"
        )
    paths = sorted(set(files.mapped_files(pid)) | set(weights))
    records = files.record(paths, cache)
    kept = tuple(os.path.dirname(w) for w in weights)  # checked where they are, never carried
    carried = tuple(r for r in records if carried_path(r.path, kept))
    (out / CARRIED_DIR).mkdir()
    for r in carried:
        shutil.copyfile(r.path, out / CARRIED_DIR / r.sha256)
    return SnapshotInfo(
        format=FORMAT,
        criu=able.version,
        factors=key_factors(able),
        output_pipe=os.readlink(f"/proc/{pid}/fd/1"),
        control_pipe=os.readlink(f"/proc/{pid}/fd/{CONTROL_FD}"),
        files=tuple(r for r in records if r not in carried),
        carried=carried,
    )


def _criu_dump(able: Able, proc: subprocess.Popen, out: Path) -> None:
    images = out / IMAGES_DIR
    images.mkdir()
    work = out.parent / "criu-dump"
    work.mkdir(exist_ok=True)
    done = subprocess.run(
        [str(able.criu), "dump", "-t", str(proc.pid), "-D", str(images), "-W", str(work), "-o", "dump.log", "-v2"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        log = (work / "dump.log").read_text(errors="replace").splitlines() if (work / "dump.log").exists() else []
        errors = [line for line in log if "Error" in line][-5:] or log[-5:]
        raise BuildError(
            f"criu dump of the snapshot's process failed (exit {done.returncode}): "
            + " | ".join(errors or [done.stderr.strip()])
            + f"; the full log is {work / 'dump.log'}"
        )
