"""What Inductor costs once per process before the first compiled step runs, paid beside other work.

Loading the first precompiled function, or the first Inductor-cache hit, pays for what no bundle
holds because it belongs to the process: Inductor's and Dynamo's imports (INDUCTOR_MODULES), the
CPU vector-ISA probe (a probe library per candidate, compiled once a machine: runtime.isa_probes;
each dlopened in a fresh Python child), the compiler's version, and the precompiled header of the
C++ kernels (its flag keys every kernel, so it cannot be turned off for a load). The imports run on
the start-up's import thread (runtime.torch_import); the probes and the header run on a thread of
their own (`InductorInit.start`) once that thread has PROBE_MODULES, beside the rest of the imports
and the weights' load, their children on the other core. The warm-up joins it before the first
function loads: `waited_s` is what did not overlap. What each part costs: docs/graphs-variants.md.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prebake.artifacts.timebox import unstoppable

if TYPE_CHECKING:
    from prebake.engine.bundled.runtime.torch_import import Imports

# What the output code of a CPU graph imports when it is first loaded (on torch 2.13, loading a
# precompiled function imports these, and nothing else of weight, on first use).
# The probes' own (imported first, so the probe thread imports nothing beside the import thread):
PROBE_MODULES = (
    "torch._inductor.cpu_vec_isa",
    "torch._inductor.cpp_builder",
    "torch._inductor.codecache",
    "torch.utils.cpp_extension",  # the build command line's torch paths (it brings in setuptools)
)
INDUCTOR_MODULES = (
    *PROBE_MODULES,  # first: the probes begin once these are in
    "torch._dynamo",
    "torch._dynamo.aot_compile",
    "torch._inductor.output_code",
    "torch._inductor.async_compile",
    "torch._inductor.lowering",
    "torch._inductor.select_algorithm",
    "torch._functorch._aot_autograd.aot_autograd_result",
)


def _probe_isa_and_compiler() -> str:
    """What the first kernel load would ask, asked now: the vector ISA (its probes' libraries seeded
    from the machine's set, runtime.isa_probes), the compiler's version and the precompiled header."""
    from torch._inductor import cpu_vec_isa
    from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions

    from prebake.engine.bundled.runtime import isa_probes

    settled = isa_probes.settle()
    isa = cpu_vec_isa.pick_vec_isa()
    CppBuilder(
        name="o", sources="i", BuildOption=CppTorchDeviceOptions(vec_isa=isa, device_type="cpu")
    ).get_command_line()
    return f"{settled.line()}, {_warm_header(isa)}"


def _warm_header(isa) -> str:
    """Inductor's precompiled header for the kernels of this ISA, as the first kernel load asks for it.

    Before it looks a CPU kernel up, Inductor's CppPythonBindingsCodeCache.load_async calls
    `_precompile_header` (functools-cached) with the kernel's build command: `g++ -E` over
    cpp_prefix.h and `openssl sha512` over the output (children, on the other core), and
    on a host without the header in $TMPDIR/torchinductor_$USER a compile of it (seconds). The call
    is made here with the arguments load_async builds for a kernel without separate kernel code on
    the picked ISA (torch 2.13), so the first load finds it done. Were torch's arguments to differ,
    the cache would miss and the load would call it again: a few tenths of a second lost, nothing
    else."""
    try:
        from torch._inductor import codecache, config

        if not config.cpp_cache_precompile_headers or sys.platform == "win32":
            return "no precompiled header (off)"
        from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions

        bindings = codecache.CppPythonBindingsCodeCache
        header = bindings._get_uncompiled_header("cpu")
        command = {
            **bindings.cpp_compile_command_flags,
            "device_type": "cpu",
            "extra_flags": (),
            "use_relative_path": config.is_fbcode(),
            "vec_isa": isa,
        }
        line = CppBuilder(
            name="o", sources="i", BuildOption=CppTorchDeviceOptions(compile_only=False, min_optimize=False, **command)
        ).get_command_line()
        codecache._precompile_header(header, line, min_optimize=False, **command)
    except (AttributeError, TypeError, ImportError) as exc:  # another torch's internals: the first load does it
        return f"precompiled header left to the first load ({type(exc).__name__}: {exc})"
    return "precompiled header ready"


@dataclass
class InductorInit:
    """Inductor's once-per-process work on a background thread; `join` says what it took."""

    imports: Imports | None = None  # the start-up's import thread, when it imports Inductor's modules
    imports_s: float = 0.0
    probes_s: float = 0.0
    probes_beside_imports: bool = False  # the probes ran while the import thread imported the rest
    probes_note: str = ""
    waited_s: float = 0.0
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    @classmethod
    def start(cls, imports: Imports | None = None) -> InductorInit:
        init = cls(imports)
        init._thread = unstoppable(threading.Thread(target=init._run, name="prebake-inductor-init", daemon=True))
        init._thread.start()
        return init

    def _run(self) -> None:
        try:
            started = time.perf_counter()
            if self.imports is None:
                for name in INDUCTOR_MODULES:
                    importlib.import_module(name)
                self.imports_s = time.perf_counter() - started
                self._probe()
                return
            if set(PROBE_MODULES) <= set(self.imports.inductor_modules):  # the probes beside the rest
                self.imports.wait_for(PROBE_MODULES)
                self.probes_beside_imports = self.imports.running()
                self._probe()
            self.imports.join()
            self.imports_s = self.imports.inductor_s
            if not self.probes_note:
                self._probe()
        except BaseException as exc:  # re-raised by join, in the thread that starts the engine
            self.error = exc

    def _probe(self) -> None:
        started = time.perf_counter()
        self.probes_note = _probe_isa_and_compiler()
        self.probes_s = time.perf_counter() - started

    def join(self) -> InductorInit:
        if self._thread is not None:
            started = time.perf_counter()
            self._thread.join()
            self.waited_s = time.perf_counter() - started
            self._thread = None
        if self.error is not None:
            raise self.error
        return self

    def describe(self) -> str:
        order = "beside the rest of them" if self.probes_beside_imports else "after them"
        return (
            f"inductor init: {self.waited_s:.2f} s waited for after the weights' load (imports "
            f"{self.imports_s:.2f} s on the import thread; {self.probes_note}, the compiler's "
            f"version: {self.probes_s:.2f} s, {order})"
        )
