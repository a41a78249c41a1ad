"""How long the serving process's OpenMP threads spin before they sleep, set before torch loads libgomp.

torch's CPU wheels run ATen's and every Inductor kernel's parallel loops on libgomp, whose threads
wait at each region's closing barrier and between regions by spinning `GOMP_SPINCOUNT` times
(default 300,000 `pause`s: milliseconds) before they sleep, shortened only when there are more
threads than CPUs. That assumes a core per thread. When another task shares one of the cores (the
HTTP server's thread, a tokenizer, a neighbour on a shared host) the thread that arrives first spins
out its time slice waiting for the one that was descheduled, at every parallel region of every step,
and the spinning counts against the process's own share of the CPU. A short spin keeps a waiting
thread hot across back-to-back kernels and puts it to sleep before it costs its partner a slice;
docs/graphs-variants.md has the measurements that chose the count.

libgomp reads the variables once, when it is loaded (by `import torch`), so `brief_waits` runs
before the engine imports torch; an operator's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept.
Other OpenMP runtimes ignore GOMP_SPINCOUNT.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

SPIN_ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
SERVING_SPIN_COUNT = "1000"  # tens of microseconds of `pause` on x86: back-to-back kernels, not a time slice


def brief_waits(environ: MutableMapping[str, str] | None = None) -> None:
    """Set GOMP_SPINCOUNT for this process unless the operator chose how OpenMP waits, or torch (and
    with it libgomp, which reads the variables once) is imported already."""
    environ = os.environ if environ is None else environ
    if POLICY_ENV not in environ and SPIN_ENV not in environ and "torch" not in sys.modules:
        environ[SPIN_ENV] = SERVING_SPIN_COUNT


def waits(environ: Mapping[str, str] | None = None) -> str:
    """How this process's OpenMP threads wait, as the start's load step says it."""
    environ = os.environ if environ is None else environ
    chosen = [f"{name}={environ[name]}" for name in (POLICY_ENV, SPIN_ENV) if name in environ]
    return f"OpenMP waits {', '.join(chosen)}" if chosen else "OpenMP waits as libgomp's default (a long spin)"
