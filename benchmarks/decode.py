"""Time per decoded token of SmolLM2-135M's widths in an AOTInductor package, the decode products and
one-query attention as Inductor reductions (runtime.gemv, the bake's default; on a CPU with AMX, bf16
and fp32 products by runtime.dot's kernel) against earlier forms of the same step, fp32 and bf16.

For each dtype a package of one decode shape (one sequence over --ctx positions) is baked per version
from recipes/smollm2-135m.toml cut to --layers layers (seeded weights of the real widths: the speed of
a step does not depend on the values), each in a child process (--versions picks which): "mm" (no
pass: torch's mm and SDPA), "products" (v1: the products alone, their left side inlined), "v2" (the
left side stored in its dtype, a bf16 one widened beside every weight), "v3" (every product a
reduction, bf16's widened: what a CPU without AMX compiles), beside the pass as it is
("reductions"). Each is served in a fresh child, interleaved over --repeat rounds, --steps timed
steps each, the engine's OpenMP waits chosen as its start chooses them. With --llama-bench and the peers' GGUFs (benchmarks/peers_setup), llama.cpp's
`llama-bench -p 0 -n STEPS -t THREADS` joins each round at the same bytes per weight. Prints medians,
ratios, the load average and one JSON line.

    python benchmarks/decode.py [--layers 30] [--dtypes fp32,bf16] [--versions mm,v2] [--ctx 256] [--steps 64]
                                [--repeat 3] [--llama-bench ~/.cache/prebake/peers/build-*/bin/llama-bench]
                                [--gguf-dir ~/.cache/prebake/peers/gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "smollm2-135m.toml"
VERSIONS = ("mm", "products", "v2", "v3", "reductions")  # before the pass, its first three versions, the pass
GGUF_TYPES = {"fp32": "f32", "bf16": "bf16"}  # llama.cpp's name of each dtype's conversion (peers_setup)


def _model(layers: int, dtype: str, ctx: int):
    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.bundled.build import model_and_cache

    recipe = load_recipe(RECIPE)
    serving = recipe.serving.model_copy(update={"max_model_len": ctx, "max_num_batched_tokens": ctx})
    return model_and_cache(recipe.model_copy(update={"serving": serving}), dtype, layers=layers)


def _shape(ctx: int):
    from prebake.engine.bundled.runtime.shapes import StepShape

    return StepShape("decode", 1, 1, ctx)


def child_build(version: str, out: str, layers: int, dtype: str, ctx: int) -> dict:
    from prebake.engine.bundled.runtime import aoti, gemv
    from prebake.engine.bundled.runtime.steps import Tactic

    if version in ("products", "v2"):  # runtime.gemv v1 and v2: a bf16 row stored (or inlined) as bf16
        gemv._widened = lambda x: x  # type: ignore[assignment]
        gemv.KEY = f"{gemv.KEY}, rows in their dtype"  # Inductor's cache key (the pass's uuid) apart from the pass's
    if version == "products":  # runtime.gemv v1: one-row products only, their left side inlined, SDPA kept
        gemv.attends = lambda *a, **k: False  # type: ignore[assignment]
        gemv._stored = lambda x: x  # type: ignore[assignment]
        gemv.KEY = f"{gemv.KEY}, products only"  # Inductor's cache key (the pass's uuid) apart from the pass's
    if version in ("products", "v2", "v3"):  # the pass's earlier versions: no kernel, as on a CPU without AMX
        aoti.dot_products = lambda model: False  # type: ignore[assignment]
    if version == "mm":  # the package as it was baked before runtime.gemv
        with_pass = aoti.package_options
        aoti.package_options = lambda *a, **k: {  # type: ignore[assignment]
            k_: v for k_, v in with_pass(*a, **k).items() if k_ != "post_grad_custom_post_pass"
        }
    model, cache = _model(layers, dtype, ctx)
    started = time.perf_counter()
    aoti.compile_package(model, cache, {_shape(ctx): Tactic()}, Path(out), log=lambda line: None)
    return {"compile_s": round(time.perf_counter() - started, 1)}


def child_serve(out: str, layers: int, dtype: str, ctx: int, steps: int) -> dict:
    from prebake.engine.bundled.runtime import openmp

    openmp.choose_waits()  # as the engine's start does: before torch loads libgomp
    import torch

    from prebake.engine.bundled.runtime import aoti
    from prebake.engine.bundled.runtime.steps import Tactic

    model, cache = _model(layers, dtype, ctx)
    shape = _shape(ctx)
    package = aoti.load_package(model, cache, [shape], Path(out))
    ids, positions, slots = torch.tensor([5]), torch.tensor([ctx - 1]), torch.tensor([0])
    got = package.decode(ids, positions, slots, ctx, Tactic())
    eager = model.decode(ids, positions, slots, cache, ctx)
    for _ in range(3):
        package.decode(ids, positions, slots, ctx, Tactic())
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        package.decode(ids, positions, slots, ctx, Tactic())
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "ms": took / steps * 1e3,
        "cpu_ms": cpu / steps * 1e3,  # every thread's CPU time: what a loaded host's waiting hides
        "threads": torch.get_num_threads(),
        "same_argmax": bool(got.argmax(-1).eq(eager.argmax(-1)).all()),
        "max_abs_diff": float((got - eager).abs().max()),
        "waits": openmp.waits(),
    }


def _child(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, cwd=REPO, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"decode child {args[:2]} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])


def llama_bench(binary: Path, gguf: Path, steps: int, threads: int) -> float:
    """llama-bench's milliseconds per generated token of `gguf` (no prompt), one repetition."""
    done = subprocess.run(
        [str(binary), "-m", str(gguf), "-p", "0", "-n", str(steps), "-t", str(threads), "-r", "1", "-o", "json"],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"llama-bench on {gguf} failed:\n{done.stderr[-2000:]}")
    rows = json.loads(done.stdout)
    return 1e3 / float(rows[0]["avg_ts"])


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--versions", default="mm,v2", help="what the pass is compared with (mm,products,v2,v3)")
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench, for the same bytes per weight")
    parser.add_argument("--gguf-dir", type=Path, default=Path.home() / ".cache/prebake/peers/gguf")
    parser.add_argument("--work", type=Path, help="keep the packages here (default: a temporary folder)")
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    if unknown := set(args.versions.split(",")) - set(VERSIONS) - {""}:
        sys.exit(f"--versions {args.versions}: no version {', '.join(sorted(unknown))} (known: {', '.join(VERSIONS)})")
    versions = [v for v in VERSIONS if v in args.versions.split(",") or v == "reductions"]
    threads = len(os.sched_getaffinity(0))
    llama = {}
    if args.llama_bench is not None:
        if args.layers != 30:
            sys.exit("--llama-bench compares the whole model: leave --layers at 30")
        llama = {d: args.gguf_dir / f"smollm2-135m-{GGUF_TYPES[d]}.gguf" for d in dtypes}
        if missing := [str(p) for p in llama.values() if not p.is_file()]:
            sys.exit(f"no GGUF {', '.join(missing)}: run benchmarks/peers_setup.py (or `make peers`) first")
    load_start = os.getloadavg()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="prebake-decode-") as tmp:
        root = args.work or Path(tmp)
        packages = {(d, v): root / f"{d}-{v}" for d in dtypes for v in versions}
        for (dtype, version), out in packages.items():
            if not (out / "aoti" / "package.json").is_file():
                built = _child("build", version, str(out), str(args.layers), dtype, str(args.ctx))
                print(f"baked {dtype} {version}: {built['compile_s']} s", flush=True)
        ms: dict[str, list[float]] = {}
        cpu_ms: dict[str, list[float]] = {}
        checks: dict[str, dict] = {}
        for round_ in range(args.repeat):  # interleaved
            for (dtype, version), out in packages.items():
                label = f"{dtype} {version}"
                got = _child("serve", str(out), str(args.layers), dtype, str(args.ctx), str(args.steps))
                ms.setdefault(label, []).append(got["ms"])
                cpu_ms.setdefault(label, []).append(got["cpu_ms"])
                checks[label] = {k: got[k] for k in ("same_argmax", "max_abs_diff", "threads", "waits")}
                print(f"round {round_ + 1} {label}: {got['ms']:.2f} ms/token, {got['cpu_ms']:.2f} CPU-ms, "
                      f"{got['waits']}, load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
            for dtype, gguf in llama.items():
                label = f"{dtype} llama.cpp"
                ms.setdefault(label, []).append(llama_bench(args.llama_bench, gguf, args.steps, threads))
                print(
                    f"round {round_ + 1} {label}: {ms[label][-1]:.2f} ms/token, load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    median = {k: round(statistics.median(v), 3) for k, v in ms.items()}
    cpu_median = {k: round(statistics.median(v), 3) for k, v in cpu_ms.items()}
    ratios: dict[str, float] = {}
    for dtype in dtypes:
        after = f"{dtype} reductions"
        for before in versions[:-1]:
            ratios[f"{dtype}_reductions_over_{before}"] = round(median[after] / median[f"{dtype} {before}"], 3)
            ratios[f"{dtype}_reductions_over_{before}_cpu"] = round(
                cpu_median[after] / cpu_median[f"{dtype} {before}"], 3
            )
        if f"{dtype} llama.cpp" in median:
            ratios[f"{dtype}_reductions_over_llama_cpp"] = round(median[after] / median[f"{dtype} llama.cpp"], 3)
    load_end = os.getloadavg()
    for label, value in median.items():
        cpu = f", {cpu_median[label]:.2f} CPU-ms" if label in cpu_median else ""
        print(f"{label:>18}: {value:8.2f} ms/token{cpu} (runs {[round(v, 2) for v in ms[label]]})")
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}x")
    print(
        f"{started_at}; load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end; {threads} threads"
    )
    print(json.dumps({"benchmark": "decode", "layers": args.layers, "ctx": args.ctx, "steps": args.steps,
                      "repeat": args.repeat, "threads": threads, "ms_per_token": median, "cpu_ms_per_token": cpu_median,
                      **ratios, "checks": checks, "started": started_at,
                      "load_average": [round(load_start[0], 2), round(load_end[0], 2)]}))  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        what, *rest = sys.argv[2:]
        if what == "build":
            result = child_build(rest[0], rest[1], int(rest[2]), rest[3], int(rest[4]))
        else:
            result = child_serve(rest[0], int(rest[1]), rest[2], int(rest[3]), int(rest[4]))
        print("RESULT " + json.dumps(result), flush=True)
    else:
        main()
