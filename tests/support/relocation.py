"""Another install of the same vLLM at another path: the serving side of the portability checks."""

from __future__ import annotations

import subprocess
from pathlib import Path


def relocated_venv(venv: Path, dest: Path) -> Path:
    """A copy of `venv` at `dest` (hard links, so gigabytes cost nothing); the python that runs from it.

    A venv's interpreter takes sys.prefix from the pyvenv.cfg beside it, so modules import from
    the copy's site-packages and every traced source file has the copy's path."""
    if not (dest / "bin" / "python").exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(venv), str(dest)], check=True)
    return dest / "bin" / "python"
