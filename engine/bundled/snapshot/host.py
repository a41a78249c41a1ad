"""Whether this host can dump and restore a process with CRIU, and the key factors a restore must match.

    criu        $PREBAKE_CRIU, else `criu` on PATH, else the one .ci/criu.sh builds
                (~/.cache/prebake/criu/<version>/criu); version 4.0 or newer (3.x fails on recent kernels),
                remembered per binary in ~/.cache/prebake/criu-check.json
    privilege   CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE (root has both)
    kernel      `criu check` passes (a pass is remembered in ~/.cache/prebake/criu-check.json per criu binary,
                kernel, boot and capabilities; a failure is checked again)
    unshare     util-linux's, for the new PID namespace a restore runs in

An answer is a value: `Able` with the binary and its version, or `Unable` with the reason and the fix.
`kdat_note` says what makes restores here slower than they need be (`prebake doctor`).
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
CHECK_CACHE = "criu-check.json"  # under ~/.cache/prebake: `criu check` passed (binary, kernel, boot,
# capabilities); each binary's version
REMEMBERED = 8  # binaries whose version the cache keeps (a rebuilt CRIU is another binary)
PASSED, VERSIONS = "passed", "versions"  # the cache's value of a passing stamp; its table of versions
_CAP_SYS_ADMIN = 21
_CAP_CHECKPOINT_RESTORE = 40
_BUILT_BY_CI = Path.home() / ".cache" / "prebake" / "criu"
KDAT_DIR = Path("/run")  # CRIU keeps its kernel-feature cache here (criu.kdat; its build's RUNDIR, /run by default)
KDAT_PROBE_S = 0.015  # what a restore spent probing again without it (docs/snapshots.md, the kernel-feature cache)


@dataclass(frozen=True)
class Able:
    criu: Path
    version: str
    unshare: Path

    def to_json(self) -> dict[str, object]:
        """`prebake doctor --json`'s answer, with `note` when restores here are slower than they need be."""
        note = kdat_note()
        return {"snapshots": True, "criu": str(self.criu), "factors": key_factors(self)} | (
            {"note": note} if note else {}
        )


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


def kdat_note(mounts: Path = Path("/proc/self/mounts")) -> str | None:
    """Why CRIU cannot keep its kernel-feature cache on this host (then every restore probes the
    kernel again, runs `iptables -L` included), or None when it can. CRIU writes KDAT_DIR/criu.kdat
    only on a tmpfs, and on any other file system leaves its criu.kdat.tmp behind, which stops later
    writes even once the folder is a tmpfs."""
    kdat = KDAT_DIR / "criu.kdat"
    if kdat.exists():
        return None
    fstype = mounted_type(KDAT_DIR, mounts)
    if fstype is None:  # no mount table to read: nothing to say
        return None
    if fstype == "tmpfs":
        stale = kdat.with_name("criu.kdat.tmp")
        if stale.exists():
            return f"{stale} is left from a CRIU that stopped while writing it, and stops CRIU keeping its kernel-feature cache: remove it"
        return None
    return (
        f"CRIU cannot keep its kernel-feature cache ({kdat}): {KDAT_DIR} is on {fstype}, "
        f"not a tmpfs, so every restore probes the kernel again (about {KDAT_PROBE_S * 1000:.0f} ms where measured); "
        f"a tmpfs at {KDAT_DIR} keeps it (docs/snapshots.md)"
    )


def mounted_type(path: Path, mounts: Path = Path("/proc/self/mounts")) -> str | None:
    """The file system type of the mount that holds `path` (the last mount of the longest mount point
    above it), or None when the mount table is unreadable."""
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        holds = target == point or target.startswith(point.rstrip("/") + "/")
        if holds and (best is None or len(point) >= best[0]):
            best = (len(point), fields[2])
    return best[1] if best else None


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
    """`criu --version`'s number, remembered on this machine (CHECK_CACHE) per binary: its path, size,
    mtime and inode (a start that restores spends no process on it: about 5 ms)."""
    identity = _binary_identity(criu)
    remembered = _read_check_cache().get(VERSIONS)
    if identity is not None and isinstance(remembered, dict) and isinstance(remembered.get(identity), str):
        return remembered[identity]
    try:
        out = subprocess.run([str(criu), "--version"], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"Version:\s*([0-9][0-9.]*)", out.stdout)
    if found is None:
        return None
    if identity is not None:
        _remember(version=(identity, found.group(1)))
    return found.group(1)


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
    if stamp is not None and _read_check_cache().get(stamp) == PASSED:
        return None
    failed = _criu_check(str(criu), kernel)
    if failed is None and stamp is not None:
        _remember(passed=stamp)
    return failed


def _check_cache() -> Path:
    """Beside the snapshot digest cache (prebake.engine.bundled.snapshot.kind.digest_cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prebake" / CHECK_CACHE


def _read_check_cache() -> dict:
    """{stamp: "passed"} for the last `criu check` that passed (the form every prebake has written),
    and "versions": {binary identity: version}; empty when absent or unreadable."""
    try:
        data = json.loads(_check_cache().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember(*, passed: str | None = None, version: tuple[str, str] | None = None) -> None:
    """Into the cache: the stamp of a `criu check` that passed (it alone is kept), or a binary's
    (identity, version) (the REMEMBERED newest are kept); a read-only home: not remembered, worked
    out again next time. A prebake that knows no versions keeps the stamp and drops them."""
    data = _read_check_cache()
    stamps = {k: v for k, v in data.items() if v == PASSED} if passed is None else {passed: PASSED}
    table = data.get(VERSIONS)
    versions: dict[str, str] = table if isinstance(table, dict) else {}
    if version is not None:
        identity, number = version
        older = [(k, v) for k, v in versions.items() if k != identity]
        versions = dict(older[-(REMEMBERED - 1) :]) | {identity: number}  # in the order written: oldest first
    cache = _check_cache()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        temp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps({**stamps, **({VERSIONS: versions} if versions else {})}))
        os.replace(temp, cache)
    except OSError:
        pass


def _binary_identity(criu: Path) -> str | None:
    """The binary as the cache keys its version: path, size, mtime and inode (JSON)."""
    parts = _binary_parts(criu)
    return None if parts is None else json.dumps(parts)


def _binary_parts(criu: Path) -> list[object] | None:
    try:
        st = os.stat(criu)
    except OSError:
        return None
    return [os.path.realpath(criu), st.st_size, st.st_mtime_ns, st.st_ino]


def _check_stamp(criu: Path, kernel: str) -> str | None:
    """The binary, the kernel, this boot and this process's capabilities, hashed: what a pass holds for."""
    parts = _binary_parts(criu)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        caps = re.search(r"^CapEff:\s*([0-9a-f]+)", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    if parts is None:
        return None
    return hashlib.sha256(json.dumps([*parts, kernel, boot, caps.group(1) if caps else ""]).encode()).hexdigest()


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
