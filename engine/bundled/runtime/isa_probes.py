"""Inductor's CPU vector-ISA probe libraries: compiled once a machine, copied into each private cache folder.

Before its first CPU kernel, Inductor compiles a small probe library per candidate ISA into its cache
folder (unless one is there) and dlopens each in a child. A bake or a compiled start has a private
folder, so each compiled them again. `settle` seeds the folder from the machine's set (every file
checked against the set's sha256 manifest; a set that does not verify is not used, and replaced),
lets torch pick the ISA (it still dlopens each library), and publishes what the probe compiled as the
set (a temporary folder renamed into place: whole or absent). The set is keyed by torch's version,
the compiler's version text, the machine and the CPU's flags, and lives beside torch's precompiled
headers (`machine_root()`). Nothing else of Inductor's is shared. Why and what it saves:
docs/graphs-variants.md; operating it: docs/operations.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from prebake.engine.common.cpu import cpu_flags

MANIFEST = "manifest.json"
SETS_DIR = "prebake-isa-probes"
_PROBE_SUFFIXES = (".cpp", ".so")


def machine_root() -> Path:
    """Where the machine's sets live: beside torch's precompiled headers, in its default cache folder."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir()) / SETS_DIR


@dataclass(frozen=True)
class Settled:
    """What `settle` did: the ISA torch picked, where its probes came from, and what that took."""

    isa: str
    source: str  # "seeded" (the machine's set), "compiled" (and published), "compiled, not published: ..."
    seconds: float

    def line(self) -> str:
        return f"vector ISA {self.isa} (probes {self.source}, {self.seconds:.2f} s)"


def settle(cache: Path | None = None, root: Path | None = None) -> Settled:
    """Torch's vector ISA for this process, its probes' libraries seeded from and published to the
    machine's set. `cache`: the process's Inductor cache folder (torch's, from TORCHINDUCTOR_CACHE_DIR);
    `root`: where the machine's sets live (`machine_root()`)."""
    from torch._inductor import cpu_vec_isa
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    started = time.perf_counter()
    cache = Path(cache if cache is not None else cache_dir())
    if cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:  # this process asked already: nothing to save
        return Settled(str(cpu_vec_isa.pick_vec_isa() or "none"), "asked before", time.perf_counter() - started)
    key = set_key()
    target = (root if root is not None else machine_root()) / key if key else None
    seeded = target is not None and _seed(target, cache)
    before = _probe_files(cache)
    isa = str(cpu_vec_isa.pick_vec_isa() or "none")
    if seeded:
        source = "seeded"
    elif target is None:
        source = "compiled, not published: the compiler's version is unknown"
    else:
        source = _publish(target, cache, sorted(_probe_files(cache) - before))
    return Settled(isa, source, time.perf_counter() - started)


def set_key() -> str | None:
    """The machine's set's name: a digest of torch's version, the compiler's version text, the machine
    and the CPU's flags; None where the compiler's version cannot be read (nothing is shared then)."""
    import torch
    from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

    try:
        compiler = get_compiler_version_info(get_cpp_compiler())
    except Exception:  # torch's internals of another version, or no compiler: torch's own probe decides
        return None
    if not compiler:
        return None
    facts = [torch.__version__, compiler, platform.machine(), " ".join(sorted(cpu_flags()))]
    return hashlib.sha256("\0".join(facts).encode()).hexdigest()[:24]


def _probe_files(cache: Path) -> set[Path]:
    """The probe-shaped files in an Inductor cache folder (its two-character subfolders), relative."""
    if not cache.is_dir():
        return set()
    return {path.relative_to(cache) for path in cache.glob("??/*") if path.suffix in _PROBE_SUFFIXES and path.is_file()}


def _seed(target: Path, cache: Path) -> bool:
    """Copy the machine's set into `cache`; False (nothing copied) where there is none or it does not verify."""
    contents = _verified(target)
    if contents is None:
        return False
    try:
        for name, data in contents.items():
            path = cache / name
            if not path.exists():  # the folder is this process's own: no reader sees a half-written file
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
    except OSError:  # a cache folder that cannot take them: torch compiles its probes as it would have
        return False
    return True


def _verified(target: Path) -> dict[Path, bytes] | None:
    """The set's files, read, where its manifest names files inside it whose sha256 digests all match; else None."""
    try:
        manifest = json.loads((target / MANIFEST).read_text())
        files = {Path(name): digest for name, digest in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not files or any(name.is_absolute() or ".." in name.parts for name in files):
        return None
    try:
        contents = {name: (target / name).read_bytes() for name in files}
    except OSError:
        return None
    if any(hashlib.sha256(data).hexdigest() != files[name] for name, data in contents.items()):
        return None
    return contents


def _publish(target: Path, cache: Path, made: list[Path]) -> str:
    """Write the files the probe made as the machine's set; says what happened."""
    if not made:
        return "found in the cache folder"
    if _verified(target) is not None:
        return "compiled (another process published the machine's set first)"
    replaced = _discard(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            digests = {}
            for name in made:
                data = (cache / name).read_bytes()
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                (staging / name).write_bytes(data)
                digests[str(name)] = hashlib.sha256(data).hexdigest()
            (staging / MANIFEST).write_text(json.dumps({"files": digests}, indent=1, sort_keys=True))
            staging.chmod(0o755)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        if target.exists():  # another process published first: its set is as good
            return "compiled (another process published the machine's set first)"
        return f"compiled, not published: {exc.strerror or exc} ({target.parent})"
    return "compiled and published for the machine" + (" (its set there did not verify: replaced)" if replaced else "")


def _discard(target: Path) -> bool:
    """Move a set that did not verify out of the way (renamed first, so a reader sees it whole or not at all)."""
    if not target.exists():
        return False
    trash = target.with_name(f".{target.name}.discarded-{os.getpid()}")
    try:
        target.rename(trash)
    except OSError:  # another process moved or replaced it first
        return False
    shutil.rmtree(trash, ignore_errors=True)
    return True
