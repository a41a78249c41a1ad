"""The host a test runs as, injected rather than assumed: the suite passes on a GPU builder too.

The probe finds accelerators through nvidia-smi and hl-smi on PATH. `cpu_only_env` drops every
PATH folder that holds either, so a process started with it (a `prebake` child, a Ray node)
probes as a CPU host on any machine; `as_cpu_host` makes this process's probe say the same.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from prebake.engine.common.probe import Host, probe

ACCELERATOR_TOOLS = ("nvidia-smi", "hl-smi")


def cpu_only_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`env` whose PATH finds no accelerator tool."""
    folders = [f for f in env.get("PATH", "").split(os.pathsep) if f]
    kept = [f for f in folders if not any((Path(f) / tool).exists() for tool in ACCELERATOR_TOOLS)]
    return {**env, "PATH": os.pathsep.join(kept)}


def cpu_host() -> Host:
    """This machine as a CPU host: its CPU, its software, no accelerator."""
    return probe(env=cpu_only_env())


def as_cpu_host(monkeypatch: pytest.MonkeyPatch) -> Host:
    """Every probe of this process answers `cpu_host()` (current_host where it is imported, and the
    Ray executor's node-side probe); returns that host."""
    host = cpu_host()
    for module in (
        "prebake.engine.common.probe",
        "prebake.engine.compose",
        "prebake.engine.cli.plan",
        "prebake.engine.fleet.local",
    ):
        monkeypatch.setattr(f"{module}.current_host", lambda: host)
    monkeypatch.setattr("prebake.engine.fleet.ray_executor.probe", lambda: host)
    return host
