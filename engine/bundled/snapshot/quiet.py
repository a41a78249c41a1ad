"""When and how a streamed restore's store entry is made: once the restored server is quiet, at idle
priority; that alone was not enough on two cores (docs/snapshots.md, "Into an empty store"): its
page-cache writes beside the first request's threads made that request 2-4x, once 50x, a prebaked
start's. Once the server ended, at the usual priority (`hurry`). Reads /proc only (CRIU is
Linux's); where /proc cannot tell, it does not wait.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

QUIET_S = 1.0  # the commit waits until the restored server has used no more than
QUIET_SHARE = 0.1  # this share of one core for this many seconds (its first requests answered),
QUIET_MOST_S = 30.0  # or this long at most: under steady traffic the store's entry still gets made


def wait_for_quiet(
    root: int,
    stopped: threading.Event,
    quiet_s: float = QUIET_S,
    most_s: float = QUIET_MOST_S,
    tick: float = 0.1,
    cpu_ticks: Callable[[int], int | None] | None = None,
) -> float:
    """Until the process tree under `root` has been quiet for `quiet_s` seconds (under QUIET_SHARE of
    a core each `tick`), `most_s` have passed or `stopped` is set; the seconds waited. `cpu_ticks`:
    the tree's CPU clock ticks so far, None once `root` is gone (default: read from /proc)."""
    read = cpu_ticks or tree_cpu_ticks
    started = time.monotonic()
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    last, quiet_since = read(root), started
    if last is None:
        return 0.0
    while not stopped.wait(tick):
        now = time.monotonic()
        used = read(root)
        if used is None or now - started >= most_s:
            break
        if (used - last) / ticks_per_s > QUIET_SHARE * tick:
            quiet_since = now
        elif now - quiet_since >= quiet_s:
            break
        last = used
    return time.monotonic() - started


def tree_cpu_ticks(root: int) -> int | None:
    """User and system CPU ticks of `root` and its descendants, read from /proc; None if `root` is gone."""
    total, pending, seen = 0, [root], set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            children = [c for task in Path(f"/proc/{pid}/task").iterdir() for c in _children(task)]
        except OSError:
            if pid == root:
                return None
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
        pending += [int(c) for c in children]
    return total


def _children(task: Path) -> list[str]:
    """The children one thread of a process forked (proc(5): each thread lists its own)."""
    try:
        return (task / "children").read_text().split()
    except OSError:  # the thread ended meanwhile
        return []


def hurry() -> None:
    """Every thread of this process at idle priority (the commit's, and those its install started)
    back to the usual policy, the main thread's nice: the server they yielded to has ended and the
    command now waits for them. At idle priority beside busy cores an install got a fraction of a
    percent of a core, and a stop waited minutes for it (docs/snapshots.md, "Stops that waited,
    or said nothing"). A nice raised by the fallback comes back only as far as RLIMIT_NICE lets it."""
    nice = os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id or 0)
    for _ in range(3):  # a thread started meanwhile by one still idle: the next pass takes it
        changed = False
        for tid in _tasks():
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    changed = True
                if os.getpriority(os.PRIO_PROCESS, tid) > nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                    changed = True
            except OSError:  # the thread ended, or the nice may not be lowered here
                continue
        if not changed:
            return


def _tasks() -> list[int]:
    try:
        return [int(task.name) for task in Path("/proc/self/task").iterdir()]
    except OSError:
        return []


def idle_priority() -> None:
    """This thread (and the threads it starts) runs only when a core is idle: SCHED_IDLE, else nice 19."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass
