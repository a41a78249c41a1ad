"""The "inductor-cache" variant: Inductor's cache folder (FX graphs, AOTAutograd entries, kernels);
a start traces every shape with Dynamo and finds each graph in the cache
(prebake.engine.bundled.runtime.steps.CompiledSteps, the one compile path of builder and server).

    graphs tree:  inductor/     Inductor's cache
                  graphs.json   the shapes, their tactics and compile seconds
"""

from __future__ import annotations

from pathlib import Path

from prebake.engine.bundled.variants.base import Compiled, CompileJob, GraphsVariant, Loaded, LoadJob, NotLoaded


class InductorCache(GraphsVariant):
    name = "inductor-cache"
    needs_inductor = True
    reads_in_place = False  # Inductor writes beside the cache it reads
    taking = "warming up from the same graphs tree's Inductor cache"

    def compile(self, job: CompileJob) -> Compiled:
        from prebake.engine.bundled.runtime.steps import CompiledSteps

        steps = CompiledSteps(job.model, job.cache, mode=job.mode, expected_shapes=len(job.tactics))
        seconds = steps.warm_up(dict(job.tactics), log=job.log)
        return Compiled(steps, seconds, {"precompiled": False})

    def load(self, job: LoadJob) -> Loaded | NotLoaded:
        """torch.compile'd steps; the first runs trace them and hit the tree's cache."""
        from prebake.engine.bundled.runtime.steps import CompiledSteps

        return Loaded(CompiledSteps(job.model, job.cache, mode=job.mode, expected_shapes=len(job.shapes)), traced=True)

    def next_in(self, tree: Path) -> str | None:
        return None  # a cache that misses compiles as it goes: nothing comes after it
