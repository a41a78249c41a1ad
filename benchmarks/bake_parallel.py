"""The bake's compile step with its step shapes in worker processes against one shape at a time, in one run.

Each build is a fresh process with an emptied Inductor cache folder, compiling every step
shape of the recipe's bucket set into an aoti-package graphs tree (`compile_graphs`, what
`doit bake` and a cold start run): one with workers=1, one with --workers (default: every core).
Prints the compile step's seconds of each, their ratio (goal <= 0.6 on two cores), the peak
resident set of the build and of its largest worker, whether the two packages hold the same bytes,
the load average; the last line is JSON.

    python benchmarks/bake_parallel.py [--model tiny-llama] [--precision bf16] [--workers N] [--repeat 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = """
import json, resource, sys, time
from pathlib import Path
from prebake.artifacts.buckets.artifact import build_bucket_set
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import compile_graphs, model_and_cache
from prebake.engine.bundled.variants import variant_of
from prebake.engine.bundled.runtime.shapes import step_shapes
from prebake.engine.bundled.runtime.steps import Tactic
recipe, dtype, out, workers = load_recipe(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
shapes = step_shapes(build_bucket_set(recipe.serving, recipe.buckets), recipe.serving.max_model_len)
# on placeholder weights where the variant allows, as `doit bake` compiles (build.build_graphs)
placeholders = variant_of(recipe).compiles_without_weights(recipe.compile.fallback)
model, cache = model_and_cache(recipe, dtype, placeholders=placeholders)
started = time.perf_counter()
compile_graphs(model, cache, recipe, {s: Tactic() for s in shapes}, out, log=lambda line: None, workers=workers)
took = time.perf_counter() - started
rss = {"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}
print("RESULT " + json.dumps({"seconds": took, "shapes": len(shapes), "rss_kib": rss}))
"""


def build(root: Path, recipe: str, precision: str, workers: int, run: int) -> dict:
    out, cache = root / f"graphs-w{workers}-{run}", root / "inductor"
    shutil.rmtree(cache, ignore_errors=True)  # one path for every build (the .so name their sources), emptied
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", BUILD, recipe, precision, str(out), str(workers)],
        env=env, cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"the build with {workers} worker(s) failed:\n{done.stdout}{done.stderr}")
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])
    with zipfile.ZipFile(out / "aoti" / "steps.pt2") as zf:
        result["contents"] = {n: hashlib.sha256(zf.read(n)).hexdigest() for n in sorted(zf.namelist())}
    return result


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeat", type=positive_int, default=1)
    parser.add_argument("--out", type=Path, help="keep the graphs trees here (default: a temporary folder)")
    args = parser.parse_args()
    load_start = os.getloadavg()
    runs: dict[int, list[dict]] = {1: [], args.workers: []}
    with tempfile.TemporaryDirectory(prefix="prebake-bake-parallel-") as tmp:
        root = args.out or Path(tmp)
        for run in range(args.repeat):  # interleaved, so a burst of load falls on both
            for workers in runs:
                result = build(root, args.model, args.precision, workers, run)
                runs[workers].append(result)
                print(f"run {run + 1}, {workers} worker(s): {result['seconds']:.1f} s", flush=True)
    serial = statistics.median(r["seconds"] for r in runs[1])
    parallel = statistics.median(r["seconds"] for r in runs[args.workers])
    same = all(r["contents"] == runs[1][0]["contents"] for rs in runs.values() for r in rs)
    load_end = os.getloadavg()
    rss = {w: max(max(r["rss_kib"].values()) for r in rs) / 2**20 for w, rs in runs.items()}
    print(f"{args.model} {args.precision}, {runs[1][0]['shapes']} step shapes")
    print(f"compile step, one shape at a time: {serial:.1f} s; {args.workers} workers: {parallel:.1f} s")
    print(f"ratio {parallel / serial:.2f} (goal <= 0.6 on two cores); peak RSS of a process {rss[1]:.2f} GiB "
          f"serial, {rss[args.workers]:.2f} GiB with workers; same package bytes: {same}")  # fmt: skip
    print(f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end")
    print(json.dumps({
        "benchmark": "bake_parallel", "model": args.model, "precision": args.precision, "workers": args.workers,
        "shapes": runs[1][0]["shapes"], "serial_s": round(serial, 2), "parallel_s": round(parallel, 2),
        "ratio": round(parallel / serial, 3), "same_package": same, "peak_rss_gib": rss,
        "load_average": [round(load_start[0], 2), round(load_end[0], 2)],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
