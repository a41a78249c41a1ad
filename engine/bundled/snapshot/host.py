"""Whether this host can dump and restore a process with CRIU, and the key factors a restore must match.

    criu        $PREBAKE_CRIU, else `criu` on PATH, else the one .ci/criu.sh builds
                (~/.cache/prebake/criu/<version>/criu); version 4.0 or newer (3.x fails on recent kernels)
    privilege   CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE (root has both)
    kernel      `criu check` passes (a pass is remembered in ~/.cache/prebake/criu-check.json per criu binary,
                kernel, boot and capabilities; a failure is checked again)
    unshare     util-linux's, for the new PID namespace a restore runs in

An answer is a value: `Able` with the binary and its version, or `Unable` with the reason and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CRIU_ENV = "PREBAKE_CRIU"
MIN_VERSION = (4, 0)
CHECK_TIMEOUT_S = 30.0
CHECK_CACHE = "criu-check.json"  # under ~/.cache/prebake: `criu check` passed, by binary, kernel, boot, capabilities
_CAP_SYS_ADMIN = 21
_CAP_CHECKPOINT_RESTORE = 40
_BUILT_BY_CI = Path.home() / ".cache" / "prebake" / "criu"


@dataclass(frozen=True)
class Able:
    criu: Path
    version: str
    unshare: Path

    def to_json(self) -> dict[str, object]:
        """`prebake doctor --json`'s answer."""
        return {"snapshots": True, "criu": str(self.criu), "factors": key_factors(self)}


@dataclass(frozen=True)
class Unable:
    reason: str  # what is missing and how to get it, one line

    def to_json(self) -> dict[str, object]:
        return {"snapshots": False, "error": self.reason}


def can_snapshot() -> Able | Unable:
    """This host's answer: whether a snapshot can be dumped or restored here, and why not."""
    if platform.system() != "Linux":
        return Unable(f"process snapshots need Linux (CRIU); this is {platform.system()}")
    criu = find_criu()
    if criu is None:
        return Unable(
            f"no CRIU: set {CRIU_ENV} to a criu binary, put criu >= 4.0 on PATH, or build one with .ci/criu.sh"
        )
    version = criu_version(criu)
    if version is None or _version_tuple(version) < MIN_VERSION:
        return Unable(
            f"{criu} is CRIU {version or '(unreadable version)'}; restores need 4.0 or newer "
            f"(Debian 12's 3.17 fails on recent kernels): build one with .ci/criu.sh and set {CRIU_ENV}"
        )
    if missing := _missing_capabilities():
        return Unable(
            f"this process lacks {', '.join(missing)}: run as root, or grant the capabilities "
            f"(in Kubernetes: securityContext.capabilities.add, docs/snapshots.md)"
        )
    unshare = shutil.which("unshare")
    if unshare is None:
        return Unable("no unshare (util-linux) on PATH: a restore runs in a new PID namespace; install util-linux")
    if (failed := _checked(criu, platform.release())) is not None:
        return Unable(f"`{criu} check` fails on this kernel ({platform.release()}): {failed}")
    return Able(criu, version, Path(unshare))


def find_criu() -> Path | None:
    given = os.environ.get(CRIU_ENV)
    if given:
        return Path(given) if os.access(given, os.X_OK) else None
    on_path = shutil.which("criu")
    if on_path and (version := criu_version(Path(on_path))) and _version_tuple(version) >= MIN_VERSION:
        return Path(on_path)
    built = sorted(_BUILT_BY_CI.glob("*/criu"), key=lambda p: _version_tuple(p.parent.name), reverse=True)
    return built[0] if built else (Path(on_path) if on_path else None)


@functools.cache
def criu_version(criu: Path) -> str | None:
    try:
        out = subprocess.run([str(criu), "--version"], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"Version:\s*([0-9][0-9.]*)", out.stdout)
    return found.group(1) if found else None


def key_factors(able: Able) -> dict[str, str]:
    """What a restore must match beside the files (prebake.engine.bundled.snapshot.files): the CRIU
    version, the kernel (its release stands for its checkpoint features: CRIU restores what this
    kernel's interfaces dumped) and the CPU's ISA flags (restored code runs the instructions the
    bake's CPU chose at import). No host name, PID or port."""
    return {
        "criu": able.version,
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_flags": cpu_flags_digest(),
    }


def cpu_flags_digest() -> str:
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        return "unknown"
    return "sha256:" + hashlib.sha256(flags.encode()).hexdigest()[:32]


def _missing_capabilities() -> list[str]:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return ["(capabilities unreadable: /proc/self/status)"]
    found = re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)
    effective = int(found.group(1), 16) if found else 0
    wanted = {"CAP_SYS_ADMIN": _CAP_SYS_ADMIN, "CAP_CHECKPOINT_RESTORE": _CAP_CHECKPOINT_RESTORE}
    missing = [name for name, bit in wanted.items() if not effective >> bit & 1]
    return [] if "CAP_SYS_ADMIN" not in missing else missing  # CAP_SYS_ADMIN alone suffices for CRIU


def _checked(criu: Path, kernel: str) -> str | None:
    """`criu check`'s answer, its pass remembered on this machine (CHECK_CACHE) for the same CRIU
    binary (path, size, mtime, inode), kernel, boot and capabilities: a restore's start spends no
    0.1 s running it again. A failure is never remembered: a fixed host is seen at once."""
    stamp = _check_stamp(criu, kernel)
    cache = _check_cache()
    try:
        if stamp is not None and json.loads(cache.read_text()).get(stamp) == "passed":
            return None
    except (OSError, ValueError, AttributeError):
        pass
    failed = _criu_check(str(criu), kernel)
    if failed is None and stamp is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            temp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
            temp.write_text(json.dumps({stamp: "passed"}))
            os.replace(temp, cache)
        except OSError:  # a read-only home: checked again next time
            pass
    return failed


def _check_cache() -> Path:
    """Beside the snapshot digest cache (prebake.engine.bundled.snapshot.kind.digest_cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prebake" / CHECK_CACHE


def _check_stamp(criu: Path, kernel: str) -> str | None:
    try:
        st = os.stat(criu)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        caps = re.search(r"^CapEff:\s*([0-9a-f]+)", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    parts = [os.path.realpath(criu), st.st_size, st.st_mtime_ns, st.st_ino, kernel, boot, caps.group(1) if caps else ""]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


@functools.cache
def _criu_check(criu: str, kernel: str) -> str | None:
    """None when `criu check` passes; else its last error line. Cached per binary and kernel."""
    try:
        out = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if out.returncode == 0:
        return None
    errors = [line for line in (out.stderr + out.stdout).splitlines() if "Error" in line]
    return (errors or [f"exit {out.returncode}"])[-1].strip()


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3]) or (0,)
