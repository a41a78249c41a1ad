"""The bundled engine's warm-up: the chain of graphs variants walked in one loop, or eager steps.

Each variant of the chain (prebake.engine.bundled.variants.chain) loads from the graphs tree; one
that does not load here says why (logged, counted in prebake_variant_fallbacks_total and the
store's stats) and the next its tree names is taken; a chain that ends without a load leaves the
start to compile in place, as on a miss. A variant that only reads its tree is served from the
store's; the first that writes beside it (Inductor) gets the private writable copy.
Each part of the warm-up is logged and exported (prebake_startup_part_seconds).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from prebake.artifacts.buckets.artifact import BucketSet
from prebake.artifacts.recipe.kinds import BUCKETS_FILE
from prebake.artifacts.recipe.schema import Recipe, Target
from prebake.artifacts.store.local import Installed, Store
from prebake.artifacts.store.stats import record_variant_fallback
from prebake.engine.bundled import cache_layout
from prebake.engine.bundled.runtime import openmp
from prebake.engine.bundled.runtime.metrics import Metrics
from prebake.engine.bundled.runtime.shapes import step_shapes
from prebake.engine.bundled.runtime.torch_import import Imports
from prebake.engine.bundled.variants import chain, variant, variant_of
from prebake.engine.bundled.variants.base import GraphsVariant, Loaded, LoadJob, NotLoaded

if TYPE_CHECKING:  # torch is imported once the environment is set
    from prebake.engine.bundled.runtime.inductor_init import InductorInit
    from prebake.engine.bundled.runtime.parallel import Parallel
    from prebake.engine.bundled.runtime.shapes import StepShape
    from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic

_NO_NEXT = 'the graphs tree carries no fallback ([compile] fallback = "none"): compiling in place'


class PhaseLog(Protocol):
    """What the warm-up writes to: the start's phase log (prebake.engine.bundled.start.StartupPhaseLog)."""

    metrics: Metrics

    def note(self, text: str) -> None: ...


@dataclass
class GraphsTree:
    """Where the start reads its graphs: the store's tree in place, or a private writable copy
    under the run folder, activated as Inductor's cache (made once, on first need)."""

    installed: Installed | None
    run_dir: Path
    path: Path | None = None
    private: bool = False

    def in_place(self) -> Path:
        assert self.installed is not None  # only a hit is read in place
        self.path = self.installed.tree
        return self.path

    def writable(self) -> Path:
        if not self.private:
            env = cache_layout.engine_environment(cache_layout.private_graphs_tree(self.installed, self.run_dir))
            cache_layout.activate(env)
            self.path, self.private = Path(env[cache_layout.GRAPHS_ENV]), True
        assert self.path is not None
        return self.path


@dataclass
class WarmUp:
    """One warm-up: the variants' chain, Inductor's init when a variant needs it, the parts' seconds."""

    log: PhaseLog
    tree: GraphsTree
    store: Store | None = None
    target: Target | None = None  # what it serves: a variant that refuses it is not loaded
    init: InductorInit | None = None  # begun at install, beside the weights' load, when the first variant needs it
    # at tp > 1: every rank's answer to "did it load?" -> the first rank's "no" (engine/bundled/start.py),
    # so that all ranks take the same road
    agree: Callable[[str | None], str | None] | None = None
    parts: dict[str, float] = field(default_factory=dict)
    _inductor_ready: bool = False

    def steps(
        self,
        first: str | None,
        recipe: Recipe,
        model,
        cache,
        schedule: dict[StepShape, Tactic],
        parallel: Parallel | None = None,
    ) -> tuple[CompiledSteps | None, str]:
        """Warm steps from the graphs tree's chain of variants from `first` (None: eager steps), and what
        the warm-up step reports; no steps when no variant loads here (the caller compiles in place)."""
        from prebake.engine.bundled.runtime.steps import CompiledSteps

        if first is None:
            steps = CompiledSteps(model, cache, compile=False)
            self.finish(steps, schedule, traced=False)
            return steps, f"{len(schedule)} step shapes eager"
        shapes = tuple(schedule)
        loaded = self.graphs(
            first, lambda tree: LoadJob(model, cache, recipe.compile.mode, shapes, tree, self.log.note, parallel)
        )
        if loaded is None:
            return None, f"{len(schedule)} step shapes: no variant of the graphs tree loads here"
        self.finish(loaded.steps, schedule, loaded.traced)
        detail = f"{len(schedule)} step shapes from the bundle ({first})"
        return loaded.steps, detail + (f"; {aot_autograd_counts()}" if loaded.traced else "")

    def graphs(self, first: str, job_of: Callable[[Path], LoadJob]) -> Loaded | None:
        """The first variant of `first`'s chain that loads; None: the start compiles in place (its tree writable)."""
        assert self.tree.path is not None  # the install step placed it
        variants = chain(first, self.tree.path)
        for current, after in zip(variants, (*(v.name for v in variants[1:]), None), strict=True):
            outcome = self._load(current, job_of)
            if self.agree is not None and (refusal := self.agree(getattr(outcome, "reason", None))) is not None:
                outcome = NotLoaded(refusal)  # this rank's load, if any, is dropped: another rank could not
            if isinstance(outcome, Loaded):
                self.parts.update(outcome.parts)
                return outcome
            self._fell_back(current, after, outcome.reason)
        self.tree.writable()  # compiling in place writes beside what it reads
        return None

    def _load(self, current: GraphsVariant, job_of: Callable[[Path], LoadJob]) -> Loaded | NotLoaded:
        if self.target is not None and (why := current.refuses(self.target)) is not None:
            return NotLoaded(why)
        if current.needs_inductor:
            self._inductor()
        tree = self.tree.path if current.reads_in_place and self.tree.path is not None else self.tree.writable()
        return current.load(job_of(tree))

    def finish(self, steps: CompiledSteps, schedule: dict[StepShape, Tactic], traced: bool) -> None:
        """The first runs of every shape, then each part's seconds logged and exported."""
        first = steps.warm_up(schedule, log=self.log.note)
        self.parts["trace-and-cache-load" if traced else "first-runs"] = sum(first.values())
        for part, took in self.parts.items():
            self.log.metrics.set("prebake_startup_part_seconds", round(took, 6), part=part)
        self.log.note("warm-up by part: " + ", ".join(f"{p} {t:.2f} s" for p, t in self.parts.items()))

    def begin_inductor(self, torch_import: Imports) -> None:
        """Inductor's init begun on a thread (at install, beside the weights' load): the first variant needs it."""
        from prebake.engine.bundled.runtime.inductor_init import InductorInit

        self.init = InductorInit.start(torch_import)

    def _inductor(self) -> None:
        """Inductor's once-per-process init: joined where begun at install, else run now."""
        if self._inductor_ready:
            return
        from prebake.engine.bundled.runtime.inductor_init import InductorInit

        init = (self.init or InductorInit.start()).join()
        self.parts["inductor-init"] = init.waited_s
        self.log.note(init.describe())
        self._inductor_ready = True

    def _fell_back(self, current: GraphsVariant, after: str | None, reason: str) -> None:
        self.log.note(f"{current.name}: {reason}; {variant(after).taking if after else _NO_NEXT}")
        self.log.metrics.add("prebake_variant_fallbacks_total", variant=current.name)
        if self.store is not None:
            record_variant_fallback(self.store, "graphs", current.name, after or "compile in place", reason)


def begin_imports(eager: bool, recipe: Recipe, run_dir: Path) -> Imports:
    """torch's imports on a thread; Inductor's too for a compiled start whose variant needs it, under
    the cache folder the install step will activate (set here, before any of Inductor is imported).
    A variant that needs none (aoti-package: torch's C++ loader) imports torch alone; a fallback to
    one that does imports Inductor then. OpenMP's waits are chosen first: libgomp reads them as torch loads it."""
    openmp.choose_waits()
    if eager or "torch._inductor.codecache" in sys.modules:
        return Imports.begin()
    from prebake.engine.bundled.runtime.inductor_init import INDUCTOR_MODULES  # names only: torch is imported lazily

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_layout.inductor_cache_dir(run_dir))
    return Imports.begin(INDUCTOR_MODULES if variant_of(recipe).needs_inductor else ())


def read_schedule(trees: dict[str, Path], max_model_len: int) -> tuple[BucketSet, dict[StepShape, Tactic]]:
    """The buckets tree's bucket set, and each of its step shapes with the autotune tree's winning
    tactic (the default one where none was measured). torch is imported by now."""
    from prebake.engine.bundled.runtime.autotune import load_winners
    from prebake.engine.bundled.runtime.steps import Tactic

    buckets = BucketSet.from_json(json.loads((trees["buckets"] / BUCKETS_FILE).read_text()))
    winners = load_winners(trees["autotune"] / cache_layout.AUTOTUNE_FILE)
    return buckets, {shape: winners.get(shape, Tactic()) for shape in step_shapes(buckets, max_model_len)}


def aot_autograd_counts() -> str:
    """What a start that traced found in Inductor's cache (Dynamo is imported already)."""
    from torch._dynamo.utils import counters

    hits, missed = counters["aot_autograd"]["autograd_cache_hit"], counters["aot_autograd"]["autograd_cache_miss"]
    return f"AOTAutograd cache {hits} hit(s), {missed} miss(es)"
