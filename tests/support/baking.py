"""Running prebake's own commands as a user would: real `doit` and `prebake` subprocesses."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"  # the project's shared data, beside every checkout (CI copies it there too)
BIN = Path(sys.executable).parent


@contextmanager
def wheel_build_lock() -> Iterator[None]:
    """Held while pip builds prebake's wheel from this checkout: setuptools writes the checkout's
    build/ and prebake.egg-info, which two builds at once (two pytest-xdist workers) would tear."""
    lock = REPO / "build" / ".wheel-build.lock"
    lock.parent.mkdir(exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


@dataclass(frozen=True)
class Home:
    """A private PREBAKE_HOME (store + embedded registry) with its own doit dependency file."""

    root: Path
    recipes: Path | None = None  # a folder of recipes found before the shipped ones (PREBAKE_RECIPES)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
        env["PREBAKE_HOME"] = str(self.root / "home")
        env["PREBAKE_TRUSTED_KEYS"] = ""  # unverified, on purpose: signing has its own tests
        if self.recipes is not None:
            env["PREBAKE_RECIPES"] = str(self.recipes)
        return env

    def doit(
        self, command: str, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 1800
    ) -> subprocess.CompletedProcess:
        """`doit COMMAND -f dodo.py --db-file <private> ARGS`, e.g. doit("run", "bake", "model=x")."""
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [str(BIN / "doit"), command, "-f", str(REPO / "dodo.py"), "--db-file", str(self.root / "doit.db"), *args]
        return subprocess.run(
            cmd, env={**self.env, **(extra_env or {})}, cwd=REPO, capture_output=True, text=True, timeout=timeout
        )

    def prebake(
        self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "prebake"), *args],
            env={**self.env, **(extra_env or {})},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
