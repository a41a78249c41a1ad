"""How long the serving process's OpenMP threads spin before they sleep, set before torch loads libgomp.

torch's CPU wheels run ATen's and every Inductor kernel's parallel loops on libgomp, whose threads
wait at each region's barrier and between regions by spinning GOMP_SPINCOUNT times (default 300,000
`pause`s: milliseconds) before they sleep. That assumes a core per thread: when another task shares
a core, the thread that arrives first spins out its time slice waiting for the descheduled one, at
every parallel region of every step, out of the process's own share of the CPU. A short spin keeps
threads hot across back-to-back kernels and sleeps before it costs a slice (docs/graphs-variants.md).
libgomp reads the variables once, as `import torch` loads it; an operator's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT is kept, and other OpenMP runtimes ignore GOMP_SPINCOUNT.
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
