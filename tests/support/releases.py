"""Older releases of prebake, runnable beside this one: each in its own venv that reuses this checkout's
installed packages (torch, pydantic...) with that release's code, for the two-releases scenarios.

    release_python(cache, commit)   the python of a venv running `commit`'s prebake (built once per cache)

The code comes from `git archive` of the commit (no worktree is registered in this repository); the
venv's .pth names this venv's site-packages, so nothing is downloaded or built: a few seconds each.
A release runs as `python tests/support/store_actor.py ...` with PYTHONPATH set to its code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RELEASES = {  # the last release before the store mark, and the one before it (tests/compat/fixtures)
    "2026-12-01": "82225c89aba26c19366442c63f6410a41fa4a888",
    "2026-11-30": "13471a299ca7b195f0748ccfc4c999b1f7f399c7",
}


def release_python(cache: Path, commit: str) -> tuple[Path, Path]:
    """(python, code folder) of a venv running `commit`'s prebake, made under `cache` once."""
    root = cache / commit[:12]
    code, venv = root / "code", root / "venv"
    python = venv / "bin" / "python"
    if python.exists():
        return python, code
    code.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(code)], input=archive.stdout, check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # every site-packages of this interpreter (a venv inside the checkout too: CI's is); this
    # checkout's own code is not among them, and the release's code comes first on PYTHONPATH
    shared = [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz-prebake-packages.pth").write_text("".join(f"{p}\n" for p in shared))
    return python, code
