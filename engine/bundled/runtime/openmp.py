"""How the serving process's OpenMP threads wait, chosen on the serving host before torch loads libgomp.

libgomp (torch's CPU wheels) makes a waiting thread spin GOMP_SPINCOUNT times (default 300,000
`pause`s: milliseconds) before it sleeps. Threads with a core each want that long spin (a sleeping
peer costs a wake-up per parallel region); threads that share cores lose their slice spinning for a
descheduled peer and want a short one (docs/graphs-variants.md has both measured). So the start
measures, before torch is imported, the cores its threads get when they all want one (that many
threads hash a buffer, the GIL released, for PROBE_SECONDS: CPU time over wall time): at least
FREE_SHARE of a core each keeps libgomp's default, less sets GOMP_SPINCOUNT=SHORT_SPIN_COUNT.
libgomp reads the variables once, as `import torch` loads it; an operator's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT is kept.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from prebake.engine.common.cpu import usable_cores

SPIN_ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
THREADS_ENV = "OMP_NUM_THREADS"
SHORT_SPIN_COUNT = "1000"  # tens of microseconds of `pause` on x86: back-to-back kernels, not a time slice
FREE_SHARE = 0.75  # of a core per thread, measured, for the threads to count as having cores of their own
PROBE_SECONDS = 0.15  # tens of scheduler slices: enough to see a share, little beside a start


@dataclass(frozen=True)
class Waits:
    """What the start decided and why, as its load step says it."""

    chosen: dict[str, str]  # the variables set (or found set by the operator); empty: libgomp's default
    reason: str

    def line(self) -> str:
        how = ", ".join(f"{k}={v}" for k, v in self.chosen.items()) or "as libgomp's default (a long spin)"
        return f"OpenMP waits {how}: {self.reason}"


_chosen: Waits | None = None  # this process's decision: libgomp reads the variables once a process


def threads_wanted(environ: Mapping[str, str]) -> int:
    """The threads OpenMP will run: OMP_NUM_THREADS's first level, else the cores this process may use."""
    given = environ.get(THREADS_ENV, "").split(",")[0].strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return usable_cores()


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


def decide(threads: int, got: float) -> Waits:
    """The waits for `threads` threads that measured `got` cores between them."""
    figure = f"{threads} threads got {got:.2f} cores"
    if got >= FREE_SHARE * threads:
        return Waits({}, f"{figure}, a core each")
    return Waits({SPIN_ENV: SHORT_SPIN_COUNT}, f"{figure}, sharing them (a short spin, then sleep)")


def choose_waits(environ: MutableMapping[str, str] | None = None, probe: Callable[[int], float] = cores_got) -> Waits:
    """Decide how this process's OpenMP threads wait and set it in `environ` (this process's), unless
    the operator chose, or torch (and with it libgomp, which reads the variables once) is imported."""
    global _chosen
    environ = os.environ if environ is None else environ
    _chosen = _choose(environ, probe)
    return _chosen


def _choose(environ: MutableMapping[str, str], probe: Callable[[int], float]) -> Waits:
    operators = {name: environ[name] for name in (POLICY_ENV, SPIN_ENV) if name in environ}
    if operators:
        return Waits(operators, "the operator's")
    threads = threads_wanted(environ)
    if threads == 1:
        return Waits({}, "one thread, nothing waits for a peer")
    if "torch" in sys.modules:
        return Waits({}, "torch was imported before the start could choose")
    waits = decide(threads, probe(threads))
    environ.update(waits.chosen)
    return waits


def waits() -> str:
    """How this process's OpenMP threads wait and why, as the start's load step says it."""
    if _chosen is not None:
        return _chosen.line()
    return Waits({k: os.environ[k] for k in (POLICY_ENV, SPIN_ENV) if k in os.environ}, "not chosen by prebake").line()
