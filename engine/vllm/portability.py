"""Whether a baked vLLM cache root is used on the host that serves it: what moves, fixed or named.

prebake's key picks the bundle; vLLM, Triton and DeepGEMM then decide, each with its own key,
whether what it holds is used, and parts of those keys depend on where things are installed
(vLLM's HOME-derived paths and traced source paths, vLLM's standalone artifact handles, Triton's
group files, Inductor's C++ compile command, DeepGEMM's include paths and nvcc): the table, with
sources and effects, is in docs/vllm.md ("Portability"). `relocate` rewrites what lives in files
(Triton group files, standalone handles) to the served copy, `pins` sets the HOME-derived vLLM
locations back to the bake's values where not set by hand, and `moved` names every other factor
that differs, with its effect, before vLLM starts. The bake records its `Site` in vllm.json.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prebake.artifacts.fsutil import atomic_target

PACKAGES = ("vllm", "torch", "triton", "deep_gemm")
HANDLES_FILE = "vllm_compile_cache.py"
GROUP_PREFIX = "__grp__"
# Locations vLLM hashed into its compile key before #47573; they never change a compiled graph.
LOCATION_VARIABLES = ("VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH")
# Per-host values vLLM 0.32 still hashes (envs.compile_factors) that are not VLLM_* variables, which
# the serve step compares anyway (prebake.engine.vllm.process.variable_drift).
PER_HOST_VARIABLES = ("MOONCAKE_REQUESTER_LOCAL_HOSTNAME",)
PROBE_TIMEOUT_S = 30.0
# Run by the vLLM interpreter: where its packages are, without importing them.
_PROBE = """
import importlib.util, json, os, sys
found = {}
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    found[name] = locations[0] if locations else None
print(json.dumps({"prefix": sys.prefix, "packages": found}))
"""


@dataclass(frozen=True)
class Site:
    """Where a vLLM process runs from: the folders its caches' keys and artifacts can depend on."""

    home: str
    config_root: str  # VLLM_CONFIG_ROOT as vLLM resolves it
    xla_cache_path: str  # VLLM_XLA_CACHE_PATH as vLLM resolves it
    cache_root: str  # VLLM_CACHE_ROOT
    prefix: str | None = None  # the interpreter's sys.prefix (the venv)
    packages: dict[str, str | None] = field(default_factory=dict)  # package -> its folder
    cuda_home: str | None = None
    nvcc: str | None = None  # `nvcc --version`'s release line
    per_host: dict[str, str | None] = field(default_factory=dict)  # PER_HOST_VARIABLES as set

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> Site | None:
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except TypeError:  # an older or foreign record: nothing to compare with
            return None


@dataclass(frozen=True)
class Moved:
    """One factor that differs between the bake and this host, and what it costs."""

    factor: str
    here: str
    baked: str
    effect: str

    def describe(self) -> str:
        return f"{self.factor}: {self.here} here, {self.baked} at bake: {self.effect}"


@dataclass(frozen=True)
class Relocated:
    """What `relocate` rewrote in a cache root copied to a new path."""

    group_files: int = 0
    handle_files: int = 0

    def describe(self) -> str:
        return (
            f"pointed {self.group_files} Triton group file(s) and {self.handle_files} vLLM artifact "
            f"handle file(s) at the served copy"
        )


def resolve_site(env: Mapping[str, str], cache_root: Path, python: str | None) -> Site:
    """This host's Site for a vLLM run with `env`, its packages as seen by `python` (None: not probed)."""
    home = env.get("HOME") or str(Path.home())
    config_home = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    cache_home = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    probed = _probe(python, env) if python else {}
    cuda_home = (
        env.get("CUDA_HOME")
        or env.get("CUDA_PATH")
        or ("/usr/local/cuda" if Path("/usr/local/cuda").is_dir() else None)
    )
    return Site(
        home=home,
        config_root=env.get("VLLM_CONFIG_ROOT") or os.path.join(config_home, "vllm"),
        xla_cache_path=env.get("VLLM_XLA_CACHE_PATH") or os.path.join(cache_home, "vllm", "xla_cache"),
        cache_root=str(cache_root),
        prefix=probed.get("prefix"),
        packages=probed.get("packages", {}),
        cuda_home=cuda_home,
        nvcc=_nvcc_release(cuda_home) if cuda_home else None,
        per_host={name: env.get(name) for name in PER_HOST_VARIABLES},
    )


def _probe(python: str, env: Mapping[str, str]) -> dict:
    try:
        done = subprocess.run(
            [python, "-c", _PROBE, *PACKAGES], env=dict(env), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
        return json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return {}


def _nvcc_release(cuda_home: str) -> str | None:
    nvcc = Path(cuda_home, "bin", "nvcc")
    if not nvcc.is_file():
        return None
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((line.strip() for line in out.splitlines() if "release" in line), None)


def pins(baked: Site, here: Site, env: Mapping[str, str]) -> dict[str, str]:
    """The HOME-derived vLLM locations set back to the bake's values, so vLLM versions that hash
    them find the baked folders; never a variable the operator set."""
    pinned = {}
    for name, attr in (("VLLM_CONFIG_ROOT", "config_root"), ("VLLM_XLA_CACHE_PATH", "xla_cache_path")):
        if name not in env and getattr(baked, attr) != getattr(here, attr):
            pinned[name] = getattr(baked, attr)
    return pinned


def moved(baked: Site, here: Site, env: Mapping[str, str]) -> list[Moved]:
    """Every factor that differs between the bake and here and that `pins` and `relocate` cannot fix."""
    found = []
    for name, attr in (("VLLM_CONFIG_ROOT", "config_root"), ("VLLM_XLA_CACHE_PATH", "xla_cache_path")):
        if name in env and getattr(baked, attr) != getattr(here, attr):
            found.append(
                Moved(
                    name,
                    getattr(here, attr),
                    getattr(baked, attr),
                    "vLLM versions before #47573 hash it into their compile key: its whole cache misses; "
                    f"unset it to let prebake pin it, or set it to {getattr(baked, attr)}",
                )
            )
    for package in PACKAGES:
        there, local = baked.packages.get(package), here.packages.get(package)
        if there and local and there != local:
            found.append(Moved(f"{package} package", local, there, _PACKAGE_EFFECT[package]))
    if baked.packages.get("deep_gemm") and baked.cuda_home and here.cuda_home and baked.cuda_home != here.cuda_home:
        found.append(Moved("CUDA_HOME", here.cuda_home, baked.cuda_home, _DEEP_GEMM_EFFECT))
    if baked.packages.get("deep_gemm") and baked.nvcc and here.nvcc and baked.nvcc != here.nvcc:
        found.append(Moved("nvcc", here.nvcc, baked.nvcc, _DEEP_GEMM_EFFECT))
    for name in PER_HOST_VARIABLES:
        there, local = baked.per_host.get(name), here.per_host.get(name)
        if name in baked.per_host and there != local:
            effect = (
                "vLLM hashes this per-host value into its compile key: its compile cache misses; unset it where unused"
            )
            found.append(Moved(name, local or "(unset)", there or "(unset)", effect))
    return found


_SAME_IMAGE = "serve from the image (same paths) it was baked in, or bake where you serve"
_DEEP_GEMM_EFFECT = (
    "DeepGEMM keys every JIT kernel on its -I include paths and the nvcc version (vllm #48190): "
    f"each kernel compiles again at first use; {_SAME_IMAGE}"
)
_PACKAGE_EFFECT = {
    "vllm": "vLLM hashes every source file it traced with its path: its own torch_compile_cache misses "
    "and vLLM recompiles its graphs (Inductor's FX-graph and AOTAutograd caches still hit); " + _SAME_IMAGE,
    "torch": "vLLM hashes the torch files Dynamo traced with their paths (its own torch_compile_cache misses), "
    "and Inductor keys each C++ kernel on its compile command, which holds torch's include folder: the "
    "FX-graph and AOTAutograd caches hit but the C++ kernels compile again; " + _SAME_IMAGE,
    "triton": "Triton's key holds its files' contents (and libdevice's), not their paths: no miss expected "
    "from the move alone",
    "deep_gemm": _DEEP_GEMM_EFFECT,
}


def relocate(root: Path, baked_root: str | None) -> Relocated:
    """Rewrite the absolute paths a copied cache root carries so they name the copy at `root`."""
    groups = sum(_relocate_group(path) for path in root.rglob(f"{GROUP_PREFIX}*.json"))
    handles = 0
    if baked_root and baked_root.rstrip("/") != str(root).rstrip("/"):
        handles = sum(_relocate_handles(path, baked_root, root) for path in root.rglob(HANDLES_FILE))
    return Relocated(groups, handles)


def _relocate_group(path: Path) -> bool:
    """Triton's group file lists its children by absolute path; they live beside it."""
    try:
        data = json.loads(path.read_text())
        children = data["child_paths"]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # not a group file Triton wrote: leave it alone
    if not isinstance(children, dict):
        return False
    rewritten = {}
    for name, old in children.items():
        sibling = path.parent / Path(str(old)).name
        rewritten[name] = str(sibling) if sibling.is_file() else old
    if rewritten == children:
        return False
    _write(path, json.dumps({**data, "child_paths": rewritten}))
    return True


def _relocate_handles(path: Path, baked_root: str, root: Path) -> bool:
    text = path.read_text(errors="strict")
    old, new = baked_root.rstrip("/") + "/", str(root).rstrip("/") + "/"
    if old not in text:
        return False
    _write(path, text.replace(old, new))
    return True


def _write(path: Path, text: str) -> None:
    mode = path.stat().st_mode
    with atomic_target(path) as tmp:
        tmp.write_text(text)
        os.chmod(tmp, mode)


@dataclass(frozen=True)
class Portability:
    """What serving a baked cache root here needs: variables to pin, and lines to log before vLLM starts."""

    pins: dict[str, str]
    notes: tuple[str, ...]


def prepare_root(report: Mapping, cache_dir: Path, env: Mapping[str, str], python: str | None) -> Portability:
    """Normalise the private copy `cache_dir` of a baked cache root (its vllm.json `report`) for this
    host, and name what still differs from the bake. `env` is the environment vLLM will get."""
    baked = Site.from_json(report["site"]) if isinstance(report.get("site"), dict) else None
    relocated = relocate(cache_dir, baked.cache_root if baked else None)
    notes = [relocated.describe()] if relocated.group_files or relocated.handle_files else []
    if baked is None:
        return Portability({}, tuple(notes))
    here = resolve_site(env, cache_dir, python)
    pinned = pins(baked, here, env)
    if pinned:
        notes.append(
            "pinned to the bake's values (vLLM versions before #47573 hash these locations): "
            + ", ".join(f"{k}={v}" for k, v in pinned.items())
        )
    notes += [f"moved since the bake: {m.describe()}" for m in moved(baked, here, env)]
    return Portability(pinned, tuple(notes))


def interpreter(command: list[str]) -> str | None:
    """The Python that runs vLLM in `command` (`<python> -m <module>`), or None when it is a script."""
    if len(command) >= 3 and command[1] == "-m":
        return command[0]
    return command[0] if Path(command[0]).name.startswith("python") else None
