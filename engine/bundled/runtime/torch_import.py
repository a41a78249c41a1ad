"""torch's imports on a thread, begun as start-up begins and joined where each is first needed.

Importing torch, and then the torch._inductor modules compiled output code imports
(runtime.inductor_init), takes seconds on two cores and needs nothing from the start-up before
it, while the steps it runs beside (lookup, fetch, unpack, the graphs tree's copy, the weights'
load) spend their time outside the GIL. So one thread imports torch, then Inductor; the "torch"
step waits for the first, the warm-up for the second, each saying how long it waited, and
`wait_for` lets Inductor's probes begin once their own modules are in. Inductor may be imported
this early only because the engine sets its cache folder (TORCHINDUCTOR_CACHE_DIR) first, to the
folder the install step will activate. The thread is `unstoppable`: a start that fails before
the import ends leaves by timebox.leave, never finalizing beside a half-imported torch.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from prebake.artifacts.timebox import unstoppable


@dataclass
class Imports:
    torch_s: float = 0.0
    inductor_s: float = 0.0
    error: BaseException | None = None  # the first import that failed (torch's, or one of Inductor's)
    torch_failed: bool = False
    inductor_modules: tuple[str, ...] = ()
    _torch_done: threading.Event = field(default_factory=threading.Event)
    _imported: set[str] = field(default_factory=set)  # of inductor_modules, so far
    _finished: bool = False
    _progress: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None

    @classmethod
    def begin(cls, inductor_modules: Sequence[str] = ()) -> Imports:
        job = cls(inductor_modules=tuple(inductor_modules))
        job._thread = unstoppable(threading.Thread(target=job._run, name="prebake-imports", daemon=True))
        job._thread.start()
        return job

    def _run(self) -> None:
        try:
            started = time.perf_counter()
            try:
                importlib.import_module("torch")
            except BaseException:
                self.torch_failed = True
                raise
            self.torch_s = time.perf_counter() - started
            self._torch_done.set()
            started = time.perf_counter()
            for name in self.inductor_modules:
                importlib.import_module(name)
                with self._progress:
                    self._imported.add(name)
                    self._progress.notify_all()
            self.inductor_s = time.perf_counter() - started
        except BaseException as exc:  # re-raised by the joins, in the thread that starts the engine
            self.error = exc
        finally:
            self._torch_done.set()
            with self._progress:
                self._finished = True
                self._progress.notify_all()

    def join_torch(self) -> str:
        """Wait for `import torch`; what the start-up's "torch" step reports."""
        started = time.perf_counter()
        self._torch_done.wait()
        if self.torch_failed and self.error is not None:
            raise self.error
        import torch

        waited = time.perf_counter() - started
        return (
            f"torch {torch.__version__} imported in {self.torch_s:.2f} s on a thread, {waited:.2f} s of it waited for"
        )

    def wait_for(self, names: Sequence[str]) -> None:
        """Wait until the thread has imported `names` (some of `inductor_modules`), not the rest."""
        unknown = set(names) - set(self.inductor_modules)
        if unknown:
            raise ValueError(f"{sorted(unknown)} are not among the modules this thread imports; name them in begin()")
        with self._progress:
            self._progress.wait_for(lambda: self._finished or self._imported.issuperset(names))
        if not self._imported.issuperset(names) and self.error is not None:
            raise self.error

    def running(self) -> bool:
        """Whether the thread is still importing."""
        with self._progress:
            return not self._finished

    def join(self) -> float:
        """Wait for every import; the seconds waited."""
        started = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.error is not None:
            raise self.error
        return time.perf_counter() - started
