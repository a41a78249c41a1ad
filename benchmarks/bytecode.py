"""prebake's modules byte-compiled before a benchmark times starts, as a wheel's install leaves them.

Where PYTHONDONTWRITEBYTECODE is set (these machines set it), Python never writes a module's .pyc, so
a module edited since the venv's install is compiled from source again by every process that imports
it: a start timed after an edit pays for its own checkout, not for prebake. `compile_prebake` writes
the stale ones once (compileall: only those whose source is newer), for the benchmarks that time
`prebake serve` processes (startup.py, peers.py).
"""

from __future__ import annotations

import compileall
import time
from pathlib import Path


def compile_prebake() -> float:
    """Byte-compile prebake's package where stale; the seconds it took (about 0.1 s when nothing is)."""
    import prebake

    started = time.perf_counter()
    package = Path(prebake.__file__).parent
    linked = (child.resolve() for child in package.iterdir() if child.is_dir() and child.name != "__pycache__")
    folders = {package, *linked}  # a checkout links its sub-packages to the top-level folders
    for folder in sorted(folders):
        compileall.compile_dir(folder, quiet=2, workers=0)
    return time.perf_counter() - started
