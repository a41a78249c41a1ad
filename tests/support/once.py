"""What a whole test run makes once, whichever pytest-xdist worker asks first: a session fixture's
folder (a bake, a written-back registry) shared by the modules of every worker, not one per worker.

The folder lies beside the workers' own temporary folders (under the run's base, which every worker
of one run shares), behind a file lock: the first worker to ask makes it, the others wait and find
it made; a serial run keeps it in its own base. What is handed out is read, never written: a test
that changes it works on its own copy (shutil.copytree), as the session fixtures' tests always did.
A make that fails leaves the folder unmarked, so the next asker makes it again (and fails the same way).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

DONE = ".made"  # written last: a folder without it was left by a make that failed


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name` that `make(folder)` filled, made once in this run by whichever worker asks first."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "once"
    root.mkdir(exist_ok=True)
    folder = root / name
    with (root / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / DONE).touch()
    return folder
