"""Decode's bf16 and float32 products by prebake's own kernel, linked into the AOTInductor package.

Inductor's reduction widens each bf16 weight before its multiply-add and leaves the weights' loads to
the hardware prefetcher, which follows decode's short rows late; so the kernel is C++ of our own
(dot.cpp, AOTInductor's C shim ABI only): bf16 by `vdpbf16ps`, float32 by AVX-512 FMA, each weight
line prefetched. The pass (runtime.gemv) writes the op `prebake::prebake_dot` for a product of up to
ROWS rows; the package's wrapper calls the kernel's C function (`custom_ops_to_c_shims`), its archive
linked into the package's shared object (`custom_op_libs`). Applies to bf16 and fp32 graphs of a CPU
platform whose ISA levels include amx, where it was measured (the package records AVX512_BF16: a host
without it refuses it). torch only where a bake builds, links or traces it. Why and measured:
docs/performance.md, "bf16 products by vdpbf16ps".
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

SOURCE = Path(__file__).with_name("dot.cpp")
OP_NAME = "prebake::prebake_dot"
SHIM = "AOTITorchError aoti_torch_cpu_prebake_dot(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0)"
ARCHIVE = "libprebake_dot.a"
DTYPES = ("bf16", "fp32")  # the recipe dtypes whose products it takes
HOW = "bf16 by vdpbf16ps, fp32 by AVX-512 FMA, weights prefetched"  # as the graphs key says it
LEVEL = "amx"  # the platform ISA level (engine.common.cpu) whose CPUs all have the flags below
FLAGS = frozenset({"avx512f", "avx512bw", "avx512_bf16"})  # what the kernel executes
ISA = "AVX512_BF16"  # added to the package's recorded ISAs (runtime.aoti.ISA_FLAGS checks it at load)
ROWS = 2  # the most rows of x the pass hands the kernel: one or two sequences' decode, each weight read once


def applies(dtype: str, isa_levels: Iterable[str]) -> bool:
    """Whether graphs of `dtype` for a CPU platform with `isa_levels` take the kernel."""
    return dtype in DTYPES and LEVEL in set(isa_levels)


@functools.cache
def digest() -> str:
    """The kernel source's sha256 (16 hex digits): in the graphs key and Inductor's cache key, so an
    edited kernel is a new key, never a cached package built from the old one."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


@functools.cache
def op():
    """The custom op the pass writes into a graph, registered once a process: its Python body is the
    product in float32 of x and w of one dtype (what tracing and an eager call run); a package runs the
    C++ kernel instead."""
    import torch

    # exact strides: Inductor hands the kernel its inputs as the pass saw them (k contiguous in both)
    tags = (torch.Tag.needs_exact_strides,)

    @torch.library.custom_op(OP_NAME, mutates_args=(), schema="(Tensor x, Tensor w) -> Tensor", tags=tags)
    def prebake_dot(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.mm(x.float(), w.float().t())

    @prebake_dot.register_fake
    def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float32)

    return torch.ops.prebake.prebake_dot.default


def archive(folder: Path) -> Path:
    """The kernel compiled into `folder`/<digest>-<torch>/libprebake_dot.a (built once, written
    atomically: two compile workers may build it at once), with the compiler Inductor links with."""
    import torch
    from torch._inductor.cpp_builder import get_cpp_compiler

    target = folder / f"{digest()}-torch{torch.__version__}" / ARCHIVE
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    include = Path(torch.__file__).parent / "include"
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        obj, staged = Path(work) / "dot.o", Path(work) / ARCHIVE
        compile_ = [get_cpp_compiler(), "-O3", "-fPIC", "-fopenmp", "-std=c++17", "-I", str(include)]
        _run([*compile_, "-c", str(SOURCE), "-o", str(obj)])
        _run(["ar", "rcs", str(staged), str(obj)])
        os.replace(staged, target)
    return target


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"building prebake's decode kernel failed: {' '.join(command)} exited {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        )


@contextlib.contextmanager
def linked(options: dict, folder: Path) -> Iterator[dict]:
    """AOT-compile options that call the kernel through its C shim and link its archive into the
    package's shared object, while the compile runs. The archive's folder is handed to the linker as
    LIBRARY_PATH (GCC's and clang's search path for `-l`), set for the compile only: Inductor names
    `custom_op_libs` as `-l` arguments and takes no folder of its own."""
    library = archive(folder)
    linking = {
        **options,
        "aot_inductor.custom_ops_to_c_shims": {op(): [SHIM]},
        "aot_inductor.custom_op_libs": [f":{ARCHIVE}"],
    }
    before = os.environ.get("LIBRARY_PATH")
    os.environ["LIBRARY_PATH"] = os.pathsep.join(p for p in (str(library.parent), before) if p)
    try:
        yield linking
    finally:
        if before is None:
            os.environ.pop("LIBRARY_PATH", None)
        else:
            os.environ["LIBRARY_PATH"] = before
