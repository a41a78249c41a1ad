"""Children for the kernel thread-count checks (tests/integration/test_kernel_threads.py and
benchmarks/threads.py): build an AOTInductor package of one decode shape, or serve it and time
decode steps, each in its own process so `taskset` decides the cores it sees.

    python -m tests.support.kernel_threads build RECIPE OUT SHAPE_JSON [static]
    python -m tests.support.kernel_threads serve RECIPE OUT SHAPE_JSON STEPS
Each prints one JSON line: torch's thread count in that process, and (serve) decode tokens per second
and per CPU-second of all its threads, the greedy tokens of the first step (so two runs can be compared), how OpenMP waits (set as the engine's
start sets it, before torch is imported) and the share of checks, 2 ms after a step, that found every
thread but the main one asleep rather than spinning. The model's dtype is the recipe's first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from prebake.engine.bundled.runtime import openmp


def imported_symbols(package: Path) -> set[str]:
    """The undefined dynamic symbols of every shared object in an AOTInductor package (`nm -D`)."""
    names: set[str] = set()
    with zipfile.ZipFile(package) as zf:
        for member in (m for m in zf.namelist() if m.endswith(".so")):
            extracted = Path(zf.extract(member, package.parent / "unzipped"))
            out = subprocess.run(["nm", "-D", "--undefined-only", str(extracted)], capture_output=True, text=True)
            names |= {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()}
    return names


def _build(recipe_path: str, out: str, shape_json: str, static: bool) -> dict:
    import torch

    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.bundled.build import model_and_cache
    from prebake.engine.bundled.runtime import aoti
    from prebake.engine.bundled.runtime.shapes import StepShape
    from prebake.engine.bundled.runtime.steps import Tactic

    if static:  # what the package was before: kernels built for this process's thread count
        real = torch._inductor.aot_compile

        def frozen(module, args, options=None):
            return real(module, args, options={**(options or {}), "cpp.dynamic_threads": False})

        torch._inductor.aot_compile = frozen
    recipe = load_recipe(recipe_path)
    model, cache = model_and_cache(recipe, recipe.matrix.dtype[0])
    shape = StepShape(**json.loads(shape_json))
    seconds = aoti.compile_package(model, cache, {shape: Tactic()}, Path(out), log=lambda line: None)
    return {"threads": torch.get_num_threads(), "compile_s": round(seconds[shape], 2)}


def _others_asleep() -> bool:
    """Whether every thread of this process but the main one is asleep (not running or runnable)."""
    for tid in (t for t in os.listdir("/proc/self/task") if int(t) != os.getpid()):
        stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        if stat[stat.rindex(")") + 2] == "R":
            return False
    return True


def _serve(recipe_path: str, out: str, shape_json: str, steps: int) -> dict:
    openmp.choose_waits()  # as the engine's start does: before torch loads libgomp
    import torch

    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.bundled.build import model_and_cache
    from prebake.engine.bundled.runtime import aoti
    from prebake.engine.bundled.runtime.shapes import StepShape
    from prebake.engine.bundled.runtime.steps import Tactic

    recipe = load_recipe(recipe_path)
    model, cache = model_and_cache(recipe, recipe.matrix.dtype[0])
    shape = StepShape(**json.loads(shape_json))
    package = aoti.load_package(model, cache, [shape], Path(out))
    ids = torch.arange(shape.batch) % model.config.vocab_size
    positions, slots = torch.full((shape.batch,), shape.ctx_len - 1), torch.arange(shape.batch)
    first = package.decode(ids, positions, slots, shape.ctx_len, Tactic()).argmax(-1).tolist()
    for _ in range(3):  # warm
        package.decode(ids, positions, slots, shape.ctx_len, Tactic())
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        package.decode(ids, positions, slots, shape.ctx_len, Tactic())
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    asleep = []
    for _ in range(10):  # libgomp's default spin lasts milliseconds; the engine's, tens of microseconds
        package.decode(ids, positions, slots, shape.ctx_len, Tactic())
        time.sleep(0.002)
        asleep.append(_others_asleep())
    return {
        "threads": torch.get_num_threads(),
        "tokens_per_s": round(steps * shape.batch / took, 2),
        "tokens_per_cpu_s": round(steps * shape.batch / cpu, 2),  # every thread's CPU time: spinning counts
        "first": first,
        "waits": openmp.waits(),
        "asleep_after_a_step": sum(asleep) / len(asleep),
    }


def main(argv: list[str]) -> int:
    what, recipe_path, out, shape_json, *rest = argv
    if what == "build":
        result = _build(recipe_path, out, shape_json, static=rest[:1] == ["static"])
    else:
        result = _serve(recipe_path, out, shape_json, int(rest[0]))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
