"""Starting, waiting for and killing the actor processes of the fault scenarios."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from prebake.artifacts.store.local import Store
from prebake.artifacts.store.settings import StoreLimits
from prebake.registry.trust.policy import POLICY_ENV
from prebake.registry.trust.signing import SIGNING_KEY_ENV, SIGNING_KEY_NAME_ENV

REPO = Path(__file__).resolve().parents[2]
IN_FORCE = (POLICY_ENV, SIGNING_KEY_ENV, SIGNING_KEY_NAME_ENV)  # the scenario's trust policy and fleet key


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this one's without PREBAKE_* settings, except the trust
    policy in force (tests/faults/in_force.py), so children run under the scenario's policy too."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_") or k in IN_FORCE}
    return {**base, **extra}


def actor(role: str, *args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """Start one actor process (tests/faults/actors.py) from the repository root."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults.actors", role, *args],
        cwd=REPO,
        env=child_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def result(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """The JSON line an actor printed; fails the scenario with its stderr if it did not exit 0, or if
    it ran without the trust policy this process has in force."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"actor exited {proc.returncode}:\n{err[-3000:]}"
    said = json.loads(out.strip().splitlines()[-1])
    assert said["policy"] or POLICY_ENV not in os.environ, f"the actor ran without the policy in force: {said}"
    return said


def racing_bakers(tmp_path: Path, scenario, address: str, builds, env: dict[str, str] | None = None) -> list[dict]:
    """One bake actor per build, each with its own store, publishing one key to `address`, released at once."""
    go = tmp_path / "go"
    procs = []
    for i, build in enumerate(builds):
        home = str(scenario.store(tmp_path / f"home-{i}"))
        args = ["--home", home, "--registry", address, "--build", build, "--go", str(go)]
        procs.append(actor("bake", *args, env=env))
    go.touch()
    return [result(p, timeout=120) for p in procs]  # exit 0 for all: losing the race is not a failed bake


def killed(proc: subprocess.Popen, timeout: float = 60) -> str:
    """Wait for an actor that is meant to die by SIGKILL; its stderr."""
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == -9, f"actor was meant to be killed, exited {proc.returncode}:\n{err[-3000:]}"
    return err


def wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"actor exited {proc.returncode} before {path.name}: {proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.01)


def unbounded(home: Path) -> Store:
    return Store(home, StoreLimits())
