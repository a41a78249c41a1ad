"""The AOTInductor graphs variant ("aoti-package", the default): each step shape a named model of one .pt2
package, compiled from torch.export and loaded by torch's C++ loader, without Dynamo or Inductor's Python.

    graphs tree:  aoti/steps.pt2      the package: one model per step shape (prefill-b1-t16-c16, ...)
                  aoti/package.json   what decides whether it loads here: torch, device, vector ISA,
                                      models, the constants they take, the package's sha256
                  aot/, inductor/     only with [compile] fallback = "dynamo-precompile"

Weights are not in the package: each model's constants are bound to the serving model's tensors at
load (no copy), so a fine-tune of the architecture loads it. A package that does not load here raises
`PackageDoesNotLoad` with the reason; the start takes what the variant's `next_in` names
(prebake.engine.bundled.variants.aoti_package).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from prebake.artifacts.frozen import Frozen
from prebake.engine.bundled.runtime import dot
from prebake.engine.bundled.runtime.fp8_linear import is_fp8
from prebake.engine.bundled.runtime.model import KVCache, Llama
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
from prebake.engine.common.cpu import cpu_flags, isa_levels

if TYPE_CHECKING:
    from prebake.engine.bundled.runtime.aoti_workers import Workers

AOTI_DIR = "aoti"
PACKAGE = "steps.pt2"
PACKAGE_FILE = "package.json"
_PREFIX = "model."  # the exported wrapper holds the model under this attribute: its constants' names begin so

# What Inductor's vector ISA names (AOTI_CPU_ISA, "AVX512 AVX512_VNNI") need of /proc/cpuinfo's flags.
ISA_FLAGS: dict[str, frozenset[str]] = {
    "AVX2": frozenset({"avx2", "fma"}),
    "AVX512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "AVX512_VNNI": frozenset({"avx512_vnni"}),
    "AVX512_BF16": frozenset({"avx512_bf16"}),
    "AMX": frozenset({"amx_tile"}),
    "AMX_TILE": frozenset({"amx_tile"}),
    "AMX_FP16": frozenset({"amx_fp16"}),
    "ASIMD": frozenset({"asimd"}),
    "NEON": frozenset({"asimd"}),
    "SVE": frozenset({"sve"}),
    "SVE256": frozenset({"sve"}),
}


class PackageRecord(Frozen):
    """aoti/package.json: what decides whether the package loads on a host, written at bake."""

    torch: str
    device: str = "cpu"
    cpu_isa: str = ""  # AOTInductor's AOTI_CPU_ISA: the vector ISA its CPU kernels use ("AVX512 AVX512_VNNI")
    machine: str = ""
    compute_capability: str = ""  # on a GPU: AOTI_COMPUTE_CAPABILITY ("90")
    models: tuple[str, ...] = ()  # the step shapes' names, one model each
    sha256: str = ""  # of steps.pt2
    constants: tuple[str, ...] = ()  # what each model takes from the serving model, by name
    tp: int = 1  # the tensor-parallel size its collectives were traced for; every rank loads this one package


class PackageDoesNotLoad(RuntimeError):
    """The graphs tree's AOTInductor package cannot serve on this host; the message says why."""


class _Step(torch.nn.Module):
    """One step shape of the model as an exportable module: the KV cache flattened into inputs."""

    def __init__(self, model: Llama, shape: StepShape, tactic: Tactic) -> None:
        super().__init__()
        self.model, self.shape, self.attn_impl = model, shape, tactic.attn_impl
        self.layers = len(model.layers)

    def forward(self, ids, per_row, slots, *kv):
        cache = KVCache(tuple(kv[: self.layers]), tuple(kv[self.layers :]))
        if self.shape.phase == "prefill":
            return self.model.prefill(ids, per_row, slots, cache, self.attn_impl)
        return self.model.decode(ids, per_row, slots, cache, self.shape.ctx_len, self.attn_impl)


def example_inputs(shape: StepShape, cache: KVCache) -> tuple:
    """Placeholder inputs of one step, as the loaded package is called: ids, lengths or positions,
    slots, then every layer's keys and values."""
    b, device = shape.batch, cache.keys[0].device
    slots = torch.arange(b, device=device)
    if shape.phase == "prefill":
        ids = torch.ones((b, shape.tokens), dtype=torch.long, device=device)
        per_row = torch.full((b,), shape.tokens, device=device)
    else:
        ids = torch.ones((b,), dtype=torch.long, device=device)
        per_row = torch.full((b,), shape.ctx_len - 1, device=device)
    return ids, per_row, slots, *cache.keys, *cache.values


def package_options(mode: str = "default", world: int = 1, fp8: bool = False, dot_products: bool = False) -> dict:
    """What every shape is AOT-compiled with (the same in the serial loop and in the workers). An FP8
    model's casts are kept as written (emulate_precision_casts): its activations are quantized from
    bf16 values, and skipping the bf16 rounding before them moves FP8 roundings, so logits 3% apart
    from eager's (measured on the tests' 2-layer recipe); kept, the package's equal eager's. Every
    other model's decode products and attention are Inductor reductions (runtime.gemv), its products
    runtime.dot's kernel with `dot_products` (compile_shape links it)."""
    import torch._inductor

    from prebake.engine.bundled.runtime.gemv import decode_matmuls

    return {
        **(torch._inductor.list_mode_options(mode) if mode != "default" else {}),
        "aot_inductor.package": True,
        "aot_inductor.package_constants_in_so": False,  # weights are bound at load, never packaged
        "cpp.dynamic_threads": True,  # kernels take the serving host's thread count (steps.threads_at_run_time)
        # at tp > 1 every rank binds its own shard: no tensor (Inductor inlines 1-D ones of up to 8
        # values, graph.py's can_inline_constant) may be baked in as rank 0's literal values
        **({"always_keep_tensor_constants": True} if world > 1 else {}),
        **({"emulate_precision_casts": True} if fp8 else {"post_grad_custom_post_pass": decode_matmuls(dot_products)}),
    }


def compile_shape(model: Llama, cache: KVCache, shape: StepShape, tactic: Tactic, options: dict) -> list[str]:
    """Export and AOT-compile one step shape; the files it built (shared objects stripped, C++ sources)."""
    import torch._inductor

    exported = torch.export.export(_Step(model, shape, tactic), example_inputs(shape, cache), strict=False)
    with _kernels_linked(options) as linking:
        listed = torch._inductor.aot_compile(exported.module(), exported.example_inputs[0], options=linking)
    if not isinstance(listed, list):  # with aot_inductor.package, torch 2.13 returns the files to package
        raise TypeError(f"torch {torch.__version__}'s aot_compile returned {type(listed).__name__}, not files")
    built = [str(f) for f in listed if isinstance(f, str)]
    _strip(built)
    return built


@contextlib.contextmanager
def _kernels_linked(options: dict) -> Iterator[dict]:
    # the pass's products call runtime.dot's kernel: its archive built (once) in Inductor's cache folder
    # and linked into each model's shared object
    if not getattr(options.get("post_grad_custom_post_pass"), "links_dot", False):
        yield dict(options)
        return
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    with dot.linked(dict(options), Path(cache_dir()) / "prebake-dot") as linking:
        yield linking


def dot_products(model: Llama) -> bool:
    """Whether `model`'s package takes runtime.dot's kernel: bf16 or fp32 weights on this host, a CPU
    whose ISA levels include amx (as the graphs key says: runtime.gemv.key) and whose flags the
    kernel needs (every AMX CPU's; a hypervisor may hide one)."""
    from prebake.engine.bundled.runtime.loader import dtype_name  # the loader's imports: a bake's only

    weight = model.embed_tokens.weight
    dtype = dtype_name(weight.dtype)
    if is_fp8(model) or weight.device.type != "cpu" or not dot.applies(dtype, isa_levels(Path("/proc"), [])[0]):
        return False
    return dot.FLAGS.issubset(cpu_flags())


def compile_package(
    model: Llama,
    cache: KVCache,
    tactics: dict[StepShape, Tactic],
    out: Path,
    *,
    mode: str = "default",
    log=print,
    workers: Workers | None = None,
) -> dict[StepShape, float]:
    """Export and AOT-compile every shape with its tactic into out/aoti/steps.pt2; seconds per shape.
    `workers`: compile the shapes in that many processes at once (runtime.aoti_workers); else one by one."""
    from torch._inductor.package import package_aoti

    from prebake.engine.bundled.runtime import aoti_workers

    folder = out / AOTI_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PACKAGE).unlink(missing_ok=True)  # a compile in place over a package that did not load
    if linked := dot_products(model):
        log(f"  aoti: decode's products by prebake's kernel, {dot.HOW} (runtime.dot {dot.digest()})")
    options = package_options(mode, _world(model), fp8=is_fp8(model), dot_products=linked)
    if workers is not None and workers.count > 1 and len(tactics) > 1:
        built, seconds = aoti_workers.compile_in_workers(workers, tactics, options, log, compile_shape)
    else:
        if workers is not None:
            log(f"  aoti: {len(tactics)} shapes one at a time in this process ({workers.why})")
        built, seconds = aoti_workers.compile_one_by_one(model, cache, tactics, options, log, compile_shape)
    files = {s.name: [f for f in built[s] if not f.endswith(".cpp")] for s in tactics}  # the loader needs the .so
    sources = [f for s in tactics for f in built[s] if f.endswith(".cpp")]  # left out of the package
    package_aoti(str(folder / PACKAGE), files)  # type: ignore[arg-type]  # a dict of model name to its files
    for name in (*sources, *(f for listed in files.values() for f in listed)):  # packed: no second copy
        Path(name).unlink(missing_ok=True)
    first = torch._C._aoti.AOTIModelPackageLoader(str(folder / PACKAGE), next(iter(files)), False, 1, -1)
    metadata = first.get_metadata()
    record = PackageRecord(
        torch=torch.__version__,
        device=metadata.get("AOTI_DEVICE_KEY", cache.keys[0].device.type),
        cpu_isa=" ".join(filter(None, (metadata.get("AOTI_CPU_ISA", ""), dot.ISA if linked else ""))),
        machine=metadata.get("AOTI_MACHINE", ""),
        compute_capability=metadata.get("AOTI_COMPUTE_CAPABILITY", ""),
        models=tuple(sorted(files)),
        sha256=_sha256(folder / PACKAGE),
        constants=tuple(sorted(first.get_constant_fqns())),
        tp=_world(model),
    )
    (folder / PACKAGE_FILE).write_text(json.dumps(record.model_dump(mode="json"), indent=1, sort_keys=True))
    return seconds


def _world(model: Llama) -> int:
    return 1 if model.parallel is None else model.parallel.world


def _strip(files: list[str]) -> None:
    """The shared objects among `files` stripped of what loading and running do not read
    (`strip --strip-unneeded`; sizes in docs/graphs-variants.md); left as built without binutils."""
    if (strip := shutil.which("strip")) is not None:
        for name in (f for f in files if f.endswith(".so")):
            subprocess.run([strip, "--strip-unneeded", name], check=True, capture_output=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def platform_problem(
    recorded: PackageRecord, *, device: str, flags: frozenset[str], capability: str = ""
) -> str | None:
    """Why a package recorded as `recorded` cannot run here, or None. `capability`: the GPU's
    compute capability as AOTInductor writes it ("90"), on a GPU."""
    if recorded.torch != torch.__version__:
        return (
            f"it was compiled with torch {recorded.torch} and this is torch {torch.__version__} "
            f"(AOTInductor's shared objects are built against one torch)"
        )
    if recorded.device != device:
        return f"it was compiled for {recorded.device} and the model runs on {device}"
    built_for = recorded.compute_capability
    if device != "cpu" and built_for and capability and built_for != capability:
        return f"its kernels were built for compute capability {built_for} and this GPU's is {capability}"
    if device == "cpu":
        for isa in recorded.cpu_isa.upper().split():
            if isa not in ISA_FLAGS:
                return f"its kernels were built for vector ISA {isa}, which prebake cannot check on this CPU"
            if missing := sorted(ISA_FLAGS[isa] - flags):
                return f"its kernels were built for vector ISA {isa} and this CPU lacks {', '.join(missing)}"
    return None


@dataclass
class PackageParts:
    """Seconds of loading a package, by part (the start's phase log shows them)."""

    package_load: float = 0.0  # the package's digest checked, each model's files unpacked and its shared object loaded
    bind: float = 0.0  # the serving model's tensors bound as each model's constants

    def as_dict(self) -> dict[str, float]:
        return {"package-load": self.package_load, "bind": self.bind}


class PackageSteps(CompiledSteps):
    """CompiledSteps whose prefill/decode run the package's model of their step shape."""

    def __init__(self, model: Llama, cache: KVCache, runners: dict[StepShape, torch._C._aoti.AOTIModelPackageLoader]):
        super().__init__(model, cache, compile=False)
        self.runners = dict(runners)
        self.source: tuple[Path, str] | None = None  # the package file loaded and its sha256, once loaded
        self._kv = [*cache.keys, *cache.values]
        self._prefill = self._prefill_shape  # type: ignore[assignment]  # same call shape, untyped args
        self._decode = self._decode_shape  # type: ignore[assignment]

    def _prefill_shape(self, ids, lengths, slots, cache, attn_impl):
        b, t = ids.shape
        return self._run(StepShape("prefill", b, t, t), [ids, lengths, slots, *self._kv])

    def _decode_shape(self, ids, positions, slots, cache, ctx_len, attn_impl):
        return self._run(StepShape("decode", ids.shape[0], 1, ctx_len), [ids, positions, slots, *self._kv])

    def _run(self, shape: StepShape, inputs: list) -> torch.Tensor:
        try:
            runner = self.runners[shape]
        except KeyError:
            raise KeyError(
                f"no AOTInductor model for step shape {shape.name}; the package holds "
                f"{sorted(s.name for s in self.runners)}; rebake graphs for this bucket set"
            ) from None
        return runner.boxed_run(inputs)[0]


def load_package(
    model: Llama,
    cache: KVCache,
    shapes: list[StepShape],
    tree: Path,
    parts: PackageParts | None = None,
    *,
    cpuinfo: Path = Path("/proc/cpuinfo"),
) -> PackageSteps:
    """The package's model of every shape, bound to `model`'s tensors; PackageDoesNotLoad says why not."""
    parts = parts if parts is not None else PackageParts()
    folder = tree / AOTI_DIR
    try:
        recorded = PackageRecord.model_validate_json((folder / PACKAGE_FILE).read_bytes())
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise PackageDoesNotLoad(
            f"the graphs tree at {tree} has no readable {AOTI_DIR}/{PACKAGE_FILE} ({exc})"
        ) from exc
    device = cache.keys[0].device.type
    capability = ""
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability(cache.keys[0].device)
        capability = f"{major}{minor}"
    if problem := platform_problem(recorded, device=device, flags=cpu_flags(cpuinfo), capability=capability):
        raise PackageDoesNotLoad(f"the AOTInductor package does not load here: {problem}")
    if recorded.tp != _world(model):
        raise PackageDoesNotLoad(
            f"the AOTInductor package does not load here: it was compiled for tp {recorded.tp} and this "
            f"rank is one of {_world(model)}; bake graphs for tp {_world(model)}"
        )
    if missing := sorted({s.name for s in shapes} - set(recorded.models)):
        raise PackageDoesNotLoad(
            f"the AOTInductor package does not load here: it holds no model for {', '.join(missing)} "
            f"(baked for another bucket set)"
        )
    # A shared object cut short is no exception but a SIGBUS once dlopen maps it: the package's bytes
    # are checked against the bake's before any model is loaded (counted in package-load).
    started = time.perf_counter()
    found = _sha256(folder / PACKAGE)
    parts.package_load += time.perf_counter() - started
    if recorded.sha256 != found:
        raise PackageDoesNotLoad(
            f"the AOTInductor package does not load here: {AOTI_DIR}/{PACKAGE} is damaged (sha256 {found[:12]}, "
            f"baked as {recorded.sha256[:12]}); rebake graphs"
        )
    # torch's loader makes its extraction folder (TMPDIR/aotinductor_<random suffix>) first and removes it only
    # in its destructor, which a refused model never reaches: a model the archive lacks is named here.
    if absent := sorted({s.name for s in shapes} - _models_in(folder / PACKAGE)):
        raise PackageDoesNotLoad(
            f"the AOTInductor package does not load here: its archive holds no model for {', '.join(absent)} "
            f"though {PACKAGE_FILE} lists it; rebake graphs"
        )
    tensors = {_PREFIX + name: t for name, t in (*model.named_parameters(), *model.named_buffers())}
    runners = {}
    for shape in shapes:
        started = time.perf_counter()
        try:
            runner = torch._C._aoti.AOTIModelPackageLoader(
                str(folder / PACKAGE), shape.name, False, 1, cache.keys[0].device.index or -1
            )  # device index -1: the current device (cuda, cuda:0)
        except Exception as exc:  # a model name the package lacks, a damaged shared object, a bad archive
            raise PackageDoesNotLoad(f"the AOTInductor package does not load here: {_first_line(exc)}") from exc
        bound = time.perf_counter()
        parts.package_load += bound - started
        wanted = runner.get_constant_fqns()
        if absent := [name for name in wanted if name not in tensors]:
            raise PackageDoesNotLoad(
                f"the AOTInductor package does not load here: its model {shape.name} takes constants the "
                f"serving model lacks ({', '.join(absent[:3])}...): another architecture"
            )
        # user_managed: the loader keeps the serving model's own tensors (no copy); the engine keeps them alive
        runner.load_constants({name: tensors[name] for name in wanted}, False, True, True)
        parts.bind += time.perf_counter() - bound
        runners[shape] = runner
    steps = PackageSteps(model, cache, runners)
    steps.source = (folder / PACKAGE, found)
    return steps


def _models_in(package: Path) -> frozenset[str]:
    """The models whose shared object the package's archive holds (<name>/data/aotinductor/<model>/*.so)."""
    try:
        with zipfile.ZipFile(package) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise PackageDoesNotLoad(f"the AOTInductor package does not load here: {_first_line(exc)}") from exc
    return frozenset(
        p[-2] for p in (n.split("/") for n in names) if len(p) > 2 and p[-3] == "aotinductor" and p[-1].endswith(".so")
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
