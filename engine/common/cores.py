"""How many cores a process's busy threads get, measured (cores_got), and that measurement taken while
a start imports (begin, then collected): a forked child runs one busy thread fewer, the importing
thread is the last, counted from its schedstat (the time it ran against the time it waited for a CPU).

A start's imports keep one core busy and leave the others idle (docs/snapshots.md, "Where the cores
go"): the window a probe wants, so a start no longer waits for one before torch loads libgomp, nor a
restored process after its restore (runtime/openmp.py chooses the waits; docs/graphs-variants.md).
Forked twice before any thread exists (the measuring grandchild is nobody's zombie); it reports one
JSON line on a pipe and leaves with _exit.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from prebake.engine.common.cpu import usable_cores

SPIN_ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
THREADS_ENV = "OMP_NUM_THREADS"
PROBE_SECONDS = 0.15  # tens of scheduler slices: enough to see a share, little beside a start
RUNNABLE_AT_LEAST = 0.5  # of the window: an importing thread that slept longer (on disk) has no share to tell


def threads_wanted(environ: Mapping[str, str]) -> int:
    """The threads OpenMP will run: OMP_NUM_THREADS's first level, else the cores this process may use."""
    given = environ.get(THREADS_ENV, "").split(",")[0].strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return usable_cores()


def operators(environ: Mapping[str, str]) -> dict[str, str]:
    """The OpenMP waits the operator set, if any: kept wherever prebake would choose (none measured)."""
    return {name: environ[name] for name in (POLICY_ENV, SPIN_ENV) if name in environ}


def cores_got(threads: int, seconds: float = PROBE_SECONDS) -> float:
    """The cores `threads` busy threads of this process got over `seconds`: its CPU time over wall time."""
    block = bytes(256 * 1024)  # hashing it takes a fraction of a millisecond, the GIL released throughout
    deadline = time.perf_counter() + seconds

    def busy() -> None:
        while time.perf_counter() < deadline:
            hashlib.sha256(block).digest()

    workers = [threading.Thread(target=busy, daemon=True) for _ in range(threads)]
    wall, cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)


@dataclass(frozen=True)
class _Begun:
    threads: int
    pipe: int  # the measuring process's one line, then its end


_begun: _Begun | None = None
_collected: dict[int, float | None] = {}


def begin(environ: Mapping[str, str], seconds: float = PROBE_SECONDS) -> bool:
    """Measure, beside what this process does next (its imports), the cores OpenMP's threads would get:
    unless the operator chose the waits, OpenMP runs one thread, or a thread already runs (no fork
    then). Whether it began."""
    global _begun
    threads = threads_wanted(environ)
    if _begun is not None or threads < 2 or operators(environ):
        return False
    if threading.active_count() > 1 or not hasattr(os, "fork"):
        return False
    read, write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child forks the one that measures and leaves: no zombie if nobody collects
        try:
            os.close(read)
            if os.fork() == 0:
                os.write(write, json.dumps(_measure(parent, threads, seconds)).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    _begun = _Begun(threads, read)
    return True


def collect(threads: int) -> float | None:
    """The cores `threads` threads got, measured since `begin` (waiting for its window to end); None
    where none was begun for that many threads or it could not tell (the importing thread slept, no
    schedstat): the caller probes as before."""
    global _begun
    begun, _begun = _begun, None
    if begun is not None:
        _collected[begun.threads] = _read(begun)
    return _collected.get(threads)


def _read(begun: _Begun) -> float | None:
    try:
        with os.fdopen(begun.pipe, "rb") as pipe:
            said = json.loads(pipe.read() or b"null")
    except (OSError, ValueError):
        return None
    return float(said) if isinstance(said, (int, float)) else None


def _measure(parent: int, threads: int, seconds: float) -> float | None:
    """In the child: its `threads` - 1 busy threads' cores, plus the parent's main thread's share of
    a core over the same window (schedstat: nanoseconds run, nanoseconds waited on a run queue)."""
    try:
        before = _schedstat(parent)
        wall = time.perf_counter()
        got = cores_got(threads - 1, seconds)
        wall = time.perf_counter() - wall
        after = _schedstat(parent)
    except (OSError, ValueError, IndexError):
        return None
    ran, waited = after[0] - before[0], after[1] - before[1]
    if ran + waited < RUNNABLE_AT_LEAST * wall * 1e9:
        return None
    return got + ran / (ran + waited)


def _schedstat(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/task/{pid}/schedstat") as stats:
        ran, waited, _slices = stats.read().split()
    return int(ran), int(waited)
