"""How the serving process's OpenMP threads wait, chosen on the serving host before torch loads libgomp.

libgomp (torch's CPU wheels) makes a waiting thread spin GOMP_SPINCOUNT times (default 300,000
`pause`s: milliseconds) before it sleeps. Threads with a core each want that long spin (a sleeping
peer costs a wake-up per parallel region); threads that share cores lose their slice spinning for a
descheduled peer and want a short one (docs/graphs-variants.md has both measured). So the start
measures, before torch is imported, the cores its threads get when they all want one (that many
busy threads for PROBE_SECONDS, while the start imports: common/cores.py): at least
FREE_SHARE of a core each keeps libgomp's default, less sets GOMP_SPINCOUNT=SHORT_SPIN_COUNT.
libgomp reads the variables once, as `import torch` loads it; an operator's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT is kept. A snapshot's process loads libgomp with the long spin at the bake
(for_snapshot) and chooses once restored (restored_waits: docs/snapshots.md).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from prebake.engine.common import cores
from prebake.engine.common.cores import POLICY_ENV, SPIN_ENV, cores_got, threads_wanted
from prebake.engine.common.cores import THREADS_ENV as THREADS_ENV  # where the tests and callers name it
from prebake.engine.common.cores import operators as operators  # the snapshot's hand-over reads it here

SHORT_SPIN_COUNT = "1000"  # tens of microseconds of `pause` on x86: back-to-back kernels, not a time slice
FREE_SHARE = 0.75  # of a core per thread, measured, for the threads to count as having cores of their own
RESTORE_PROBE_SECONDS = 0.05  # a restore's: a dozen slices, inside a time to ready of about 0.5 s
LONG_SPIN_COUNT = "300000"  # libgomp's own default: what a snapshot's process loads it with
SNAPSHOT_ENV = "PREBAKE_OPENMP_FOR_SNAPSHOT"  # set beside LONG_SPIN_COUNT by for_snapshot, not by an operator
THROTTLED = "100, libgomp's throttled count (an idle second pool)"


@dataclass(frozen=True)
class Waits:
    """What the start decided and why, as its load step says it."""

    chosen: dict[str, str]  # the variables set (or found set by the operator); empty: libgomp's default
    reason: str

    def line(self) -> str:
        how = ", ".join(f"{k}={v}" for k, v in self.chosen.items()) or "as libgomp's default (a long spin)"
        return f"OpenMP waits {how}: {self.reason}"


_chosen: Waits | None = None  # this process's decision: libgomp reads the variables once a process


def decide(threads: int, got: float) -> Waits:
    """The waits for `threads` threads that measured `got` cores between them."""
    figure = f"{threads} threads got {got:.2f} cores"
    if got >= FREE_SHARE * threads:
        return Waits({}, f"{figure}, a core each")
    return Waits({SPIN_ENV: SHORT_SPIN_COUNT}, f"{figure}, sharing them (a short spin, then sleep)")


def choose_waits(environ: MutableMapping[str, str] | None = None, probe: Callable[[int], float] | None = None) -> Waits:
    """Decide how this process's OpenMP threads wait and set it in `environ` (this process's), unless
    the operator chose, or torch (and with it libgomp, which reads the variables once) is imported.
    `probe`: how the cores are measured; by default what was measured as the start imported
    (cores.begin), else cores_got now."""
    global _chosen
    environ = os.environ if environ is None else environ
    _chosen = _choose(environ, probe)
    return _chosen


def for_snapshot(environ: Mapping[str, str]) -> dict[str, str]:
    """What a process to be snapshotted loads libgomp with: the operator's waits, else libgomp's long
    spin whatever the bake's host measured (restored_waits shortens it on a host that shares cores)."""
    return operators(environ) or {SPIN_ENV: LONG_SPIN_COUNT, SNAPSHOT_ENV: "1"}


def restored_waits(
    given: Mapping[str, str],
    probe: Callable[[int, float], float] = cores_got,
    shorten: Callable[[], None] | None = None,
    handed: Mapping[str, object] | None = None,
) -> Waits:
    """How a process restored from a snapshot waits from now on, chosen on the serving host as a start
    chooses: `given`, the serving host operator's variables (handed over by the restoring process),
    else the cores its threads get: `handed` ({"threads", "got"}: measured by the restoring process
    as it imported, when for as many threads), else probed now; where they share cores, `shorten`
    (an idle second pool)."""
    global _chosen
    _chosen = _restored(given, probe, shorten or hold_second_pool, handed or {})
    return _chosen


def handed_over(threads: int) -> dict[str, object] | None:
    """What the restoring process measured as it imported, for the restored one (restored_waits)."""
    got = cores.collect(threads)
    return None if got is None else {"threads": threads, "got": round(got, 3)}


def _restored(
    given: Mapping[str, str],
    probe: Callable[[int, float], float],
    shorten: Callable[[], None],
    handed: Mapping[str, object],
) -> Waits:
    if given:
        spins = given.get(SPIN_ENV, LONG_SPIN_COUNT)
        short = spins.isdigit() and int(spins) < int(LONG_SPIN_COUNT)
        if given.get(POLICY_ENV, "").lower() != "passive" and not short:
            return Waits(dict(given), "the operator's")
        shorten()
        return Waits({**given, SPIN_ENV: THROTTLED}, "the operator's, as near as a restored libgomp allows")
    threads = threads_wanted(os.environ)
    if threads == 1:
        return Waits({}, "one thread, nothing waits for a peer")
    got = handed.get("got") if handed.get("threads") == threads else None
    if isinstance(got, (int, float)):
        waits = _early(decide(threads, float(got)), "by the restoring process as it imported")
    else:
        waits = decide(threads, probe(threads, RESTORE_PROBE_SECONDS))
    if not waits.chosen:
        return waits
    shorten()
    return Waits({SPIN_ENV: THROTTLED}, waits.reason)


def hold_second_pool() -> None:
    """Keep a second OpenMP pool alive and idle: a thread opens one parallel region (at::parallel_for
    over a million elements) and blocks. Its threads sleep; libgomp counts them, and shortens every
    wait of the process while it manages more threads than there are CPUs."""
    opened = threading.Event()

    def hold() -> None:
        import torch

        torch.ones(1 << 20).add_(1)
        opened.set()
        threading.Event().wait()

    threading.Thread(target=hold, name="prebake-openmp-pool", daemon=True).start()
    opened.wait(10)


def _choose(environ: MutableMapping[str, str], probe: Callable[[int], float] | None) -> Waits:
    if operators_set := operators(environ):
        snapshot = environ.get(SNAPSHOT_ENV)  # set by for_snapshot beside its spin, never by an operator
        return Waits(
            operators_set,
            "libgomp's long spin for the snapshot, chosen again once restored" if snapshot else "the operator's",
        )
    threads = threads_wanted(environ)
    if threads == 1:
        return Waits({}, "one thread, nothing waits for a peer")
    if "torch" in sys.modules:
        return Waits({}, "torch was imported before the start could choose")
    early = cores.collect(threads) if probe is None else None
    if early is not None:
        waits = _early(decide(threads, early), "as the start imported")
    else:
        waits = decide(threads, (probe or cores_got)(threads))
    environ.update(waits.chosen)
    return waits


def _early(waits: Waits, when: str) -> Waits:
    return Waits(waits.chosen, f"{waits.reason}; measured {when}")


def waits() -> str:
    """How this process's OpenMP threads wait and why, as the start's load step says it."""
    if _chosen is not None:
        return _chosen.line()
    return Waits(operators(os.environ), "not chosen by prebake").line()
