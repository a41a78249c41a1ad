"""This machine's CPU as the host probe and the runtime read it: the cores this process may use, the
first processor's flags in /proc/cpuinfo, and the vector-ISA levels (Inductor's) they make up.
Reads /proc and the affinity mask only."""

from __future__ import annotations

import os
import platform as _platform
from pathlib import Path

# ISA levels, lowest first; a level is present when the CPU reports every flag it needs.
# These are the vector ISAs Inductor's CPU code generation picks between.
_ISA_LADDERS: dict[str, tuple[tuple[str, frozenset[str]], ...]] = {
    "x86_64": (
        ("avx2", frozenset({"avx2", "fma"})),
        ("avx512", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})),
        ("amx", frozenset({"amx_tile"})),
    ),
    "aarch64": (
        ("neon", frozenset({"asimd"})),
        ("sve", frozenset({"sve"})),
        ("sve2", frozenset({"sve2"})),
    ),
}
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask (taskset, a cgroup's cpuset), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's flags as /proc/cpuinfo lists them for its first processor (x86 `flags`, Arm
    `Features`); empty where it lists none or cannot be read."""
    return _cpu_flags(cpuinfo, [])


def isa_levels(proc_root: Path, notes: list[str]) -> tuple[tuple[str, ...], str]:
    """(ISA levels sorted, arch: the machine and its highest level, "x86_64+avx512"); what could
    not be read goes to `notes`."""
    try:
        machine = (proc_root / "sys" / "kernel" / "arch").read_text().strip()
    except OSError:
        machine = _platform.machine()
    machine = _MACHINE_ALIASES.get(machine.lower(), machine.lower())
    flags = _cpu_flags(proc_root / "cpuinfo", notes)
    present = [level for level, needs in _ISA_LADDERS.get(machine, ()) if needs <= flags]
    arch = f"{machine}+{present[-1]}" if present else machine
    return tuple(sorted(present)), arch


def _cpu_flags(cpuinfo: Path, notes: list[str]) -> frozenset[str]:
    """The first processor's flags ("flags" on x86, "Features" on aarch64)."""
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                name, sep, value = line.partition(":")
                if sep and name.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError as exc:
        notes.append(f"could not read {cpuinfo} ({exc.strerror}); no CPU ISA levels assumed")
        return frozenset()
    notes.append(f"{cpuinfo} lists no CPU flags; no CPU ISA levels assumed")
    return frozenset()
