"""The "dynamo-precompile" variant: one function per step shape precompiled by Dynamo
(torch.compiler's aot_compile, prebake.engine.bundled.runtime.precompile), over the Inductor cache
of the same shapes, which a host where the functions do not load warms up from.

    graphs tree:  aot/          one precompiled function per shape
                  inductor/     Inductor's cache of the same shapes (the fallback)
                  graphs.json   "precompiled": false when the baking torch had no precompile
"""

from __future__ import annotations

from pathlib import Path

from prebake.engine.bundled.variants.base import Compiled, CompileJob, GraphsVariant, Loaded, LoadJob, NotLoaded
from prebake.engine.bundled.variants.inductor_cache import InductorCache


class DynamoPrecompile(GraphsVariant):
    name = "dynamo-precompile"
    needs_inductor = True
    reads_in_place = False  # its fallback, Inductor's cache, writes beside what it reads
    taking = "taking dynamo-precompile from the same graphs tree"

    def compile(self, job: CompileJob) -> Compiled:
        """torch.compile first (its FX-graph and AOTAutograd entries, which aot_compile's are not in
        torch 2.13, are what a host whose functions do not load warms up from), then the functions."""
        from prebake.engine.bundled.runtime import precompile

        if (unsupported := precompile.supported()) is not None:
            job.log(
                f"  dynamo-precompile: {unsupported}; baking the Inductor cache alone (the engine warms up from it)"
            )
            return InductorCache().compile(job)
        cached = InductorCache().compile(job)
        tactics = dict(job.tactics)
        functions, precompile_s = precompile.compile_shapes(
            job.model, job.cache, tactics, job.out, mode=job.mode, log=job.log
        )
        warm = functions.warm_up(tactics, log=job.log)
        seconds = {s: cached.seconds[s] + precompile_s[s] + warm[s] for s in tactics}
        return Compiled(functions, seconds, {"precompiled": True})

    def load(self, job: LoadJob) -> Loaded | NotLoaded:
        from prebake.engine.bundled.runtime import precompile

        parts = precompile.LoadParts()
        try:
            steps = precompile.load_shapes(job.model, job.cache, list(job.shapes), job.tree, parts)
        except Exception as exc:  # any load failure: the same tree's Inductor cache still serves
            return NotLoaded(f"precompiled functions do not load here ({type(exc).__name__}: {_first_line(exc)})")
        return Loaded(steps, parts.as_dict())

    def next_in(self, tree: Path) -> str | None:
        return InductorCache.name  # the functions' own Inductor cache, in the same tree


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""
