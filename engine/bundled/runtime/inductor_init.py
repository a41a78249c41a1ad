"""What Inductor costs once per process before the first compiled step runs, paid beside other work.

Loading the first precompiled function (prebake.engine.bundled.runtime.aot), or the first cache hit of the
Inductor-cache variant, pays for things no bundle holds, because they belong to the process
(measured on torch 2.13, CPU):

    imports    torch._inductor's and Dynamo's modules, which the compiled output code imports
               (INDUCTOR_MODULES): seconds on two cores
    ISA        Inductor's choice of the CPU's vector instruction set, part of every kernel's
               cache key: `valid_vec_isa_list()` builds a probe library per candidate ISA and
               feature (the bake's cache already holds them) and dlopens each in a fresh
               Python child (three children on an AVX-512 host)
    compiler   `g++ --version` and `g++ -v`, asked once for the build command line that keys
               each kernel
    header     the precompiled header of Inductor's C++ kernels: before looking a kernel up,
               Inductor preprocesses cpp_prefix.h (g++ -E, then openssl over the output: about
               0.5 s) and compiles the header into $TMPDIR/torchinductor_$USER/precompiled_headers
               when it is not there, outside any bundle. It cannot be turned off for a load: the
               header's flag is part of every kernel's build command, so of its cache key (measured:
               with TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0 every kernel misses and compiles).
               It stays on the first kernel load (docs/graphs-variants.md, "what remains").

The imports, the ISA and the compiler need no weights. The imports run on the start-up's import thread from its beginning
(prebake.engine.bundled.runtime.torch_import); the ISA and compiler probes, which read Inductor's cache folder, run
on a thread of their own once that folder is installed (`InductorInit.start`), while the weights
load; their children run on the other core. The warm-up joins the thread before the first function
loads: `waited_s` is what did not overlap.
"""

from __future__ import annotations

import importlib
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prebake.engine.bundled.runtime.torch_import import Imports

# What the output code of a CPU graph imports when it is first loaded (measured on torch 2.13:
# loading a precompiled function imports these, and nothing else of weight, on first use).
INDUCTOR_MODULES = (
    "torch._dynamo",
    "torch._dynamo.aot_compile",
    "torch._inductor.codecache",
    "torch._inductor.output_code",
    "torch._inductor.async_compile",
    "torch._inductor.lowering",
    "torch._inductor.select_algorithm",
    "torch._inductor.cpu_vec_isa",
    "torch._functorch._aot_autograd.aot_autograd_result",
)


def _probe_isa_and_compiler() -> str:
    """What the first kernel load would ask, asked now: the vector ISA and the compiler's version."""
    from torch._inductor import cpu_vec_isa
    from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions

    isa = cpu_vec_isa.pick_vec_isa()
    CppBuilder(
        name="o", sources="i", BuildOption=CppTorchDeviceOptions(vec_isa=isa, device_type="cpu")
    ).get_command_line()
    return f"vector ISA {isa or 'none'}"


@dataclass
class InductorInit:
    """Inductor's once-per-process work on a background thread; `join` says what it took."""

    imports: Imports | None = None  # the start-up's import thread, when it imports Inductor's modules
    imports_s: float = 0.0
    probes_s: float = 0.0
    probes_note: str = ""
    waited_s: float = 0.0
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    @classmethod
    def start(cls, imports: Imports | None = None) -> InductorInit:
        init = cls(imports)
        init._thread = threading.Thread(target=init._run, name="prebake-inductor-init", daemon=True)
        init._thread.start()
        return init

    def _run(self) -> None:
        try:
            started = time.perf_counter()
            if self.imports is not None:
                self.imports.join()
                self.imports_s = self.imports.inductor_s
            else:
                for name in INDUCTOR_MODULES:
                    importlib.import_module(name)
                self.imports_s = time.perf_counter() - started
            started = time.perf_counter()
            self.probes_note = _probe_isa_and_compiler()
            self.probes_s = time.perf_counter() - started
        except BaseException as exc:  # re-raised by join, in the thread that starts the engine
            self.error = exc

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
        return (
            f"inductor init: {self.waited_s:.2f} s waited for after the weights' load (imports "
            f"{self.imports_s:.2f} s on the import thread, then {self.probes_note} and the compiler's "
            f"version {self.probes_s:.2f} s)"
        )
