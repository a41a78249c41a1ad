"""The "aoti-package" variant (the default): every step shape a model of one AOTInductor package,
loaded by torch's C++ loader without Dynamo or Inductor's Python
(prebake.engine.bundled.runtime.aoti draws its tree). Its tree carries a second variant only when
the recipe asks ([compile] fallback = "dynamo-precompile"); that fallback joins its key.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prebake.artifacts.errors import BuildError
from prebake.artifacts.recipe.schema import NO_FALLBACK, CompileOptions
from prebake.engine.bundled.variants.base import (
    INDUCTOR_DIR,
    Compiled,
    CompileJob,
    GraphsVariant,
    Loaded,
    LoadJob,
    NotLoaded,
    TreeFacts,
    traced_on_one_rank,
)

_PRECOMPILED, _INDUCTOR = "dynamo-precompile", "inductor-cache"  # what a tree may carry after the package


class AotiPackage(GraphsVariant):
    name = "aoti-package"
    needs_inductor = False  # the package loads through torch's C++ loader
    reads_in_place = True  # torch's loader unpacks each model to a folder of its own: the tree is only read
    links_kernels = True  # runtime.aoti links runtime.dot's kernel into the package where it applies
    fallbacks = (_PRECOMPILED,)
    taking = "taking aoti-package from the same graphs tree"

    def key_factors(self, options: CompileOptions) -> dict[str, object]:
        return {"fallback": options.fallback}  # a tree with a fallback is another tree

    def compiles_without_weights(self, fallback: str) -> bool:
        return fallback == NO_FALLBACK  # export and AOT compile only; the package takes the weights at load

    def compile(self, job: CompileJob) -> Compiled:
        """The fallback's tree first (when the recipe asks for one), then the package, loaded once
        as a start loads it; without a fallback, Inductor's leftovers (ISA probes, locks) go."""
        from prebake.engine.bundled.runtime import aoti

        fallback = job.fallback
        if job.parallel is not None and job.parallel.world > 1 and fallback is not None:
            raise BuildError(
                f"[compile] fallback = {fallback.name!r}: {traced_on_one_rank(fallback.name, job.parallel.world)}"
            )
        inner = fallback.compile(job) if fallback is not None else None
        tactics = dict(job.tactics)
        package_s = aoti.compile_package(
            job.model, job.cache, tactics, job.out, mode=job.mode, log=job.log, workers=job.workers
        )
        seconds = {s: package_s[s] + (inner.seconds[s] if inner else 0.0) for s in tactics}
        steps = aoti.load_package(job.model, job.cache, list(tactics), job.out)  # what a start loads, checked here
        if inner is None:
            shutil.rmtree(job.out / INDUCTOR_DIR, ignore_errors=True)
        precompiled = bool(inner and inner.facts.get("precompiled"))
        return Compiled(steps, seconds, {"precompiled": precompiled, "aoti_package": True})

    def load(self, job: LoadJob) -> Loaded | NotLoaded:
        from prebake.engine.bundled.runtime import aoti

        parts = aoti.PackageParts()
        try:
            steps = aoti.load_package(job.model, job.cache, list(job.shapes), job.tree, parts, cpuinfo=_cpuinfo(job))
        except aoti.PackageDoesNotLoad as exc:
            return NotLoaded(str(exc))
        if job.parallel is not None and steps.source is not None:  # every rank says which file, which bytes
            path, sha256 = steps.source
            job.log(f"aoti-package: rank {job.parallel.rank} of {job.parallel.world} loaded {path} (sha256 {sha256})")
        return Loaded(steps, parts.as_dict())

    def next_in(self, tree: Path) -> str | None:
        """What the tree's graphs.json says it carries after the package: dynamo-precompile's functions,
        Inductor's cache alone (baked by a torch without precompile), or nothing."""
        facts = TreeFacts.read(tree)
        if facts is None or facts.fallback == NO_FALLBACK:
            return None
        return _PRECOMPILED if facts.precompiled else _INDUCTOR


_RANK_CPUINFO_ENV = "PREBAKE_TEST_RANK_CPUINFO"  # RANK:PATH, a test hook: that rank of `serve --tp N` lacks an ISA


def _cpuinfo(job: LoadJob) -> Path:
    """Where this rank reads its CPU flags: /proc/cpuinfo, or the test hook's file for its rank."""
    rank, _, path = os.environ.get(_RANK_CPUINFO_ENV, "").partition(":")
    if job.parallel is not None and path and rank == str(job.parallel.rank):
        return Path(path)
    return Path("/proc/cpuinfo")
