"""Decode tokens/s of an AOTInductor package baked on one core, served on one core and on two, in one run.

The package is baked under `taskset -c 0` (a loaded or small builder) and served pinned to one core
and to two, interleaved, medians of --repeat runs, each serve a fresh process whose OpenMP waits are
the engine's choice (runtime.openmp: libgomp's long spin when its threads measure a core each, a
short spin when they share); beside it the same package on two cores with each wait forced
(libgomp's default GOMP_SPINCOUNT=300000, and the short spin, GOMP_SPINCOUNT=1000), and
(unless --no-frozen) the package as it was before kernels read their thread count at run time
(`cpp.dynamic_threads` off): baked on one core, and baked on two, both served on two. Ratios
within the run, the load average printed beside them. --heads/--kv-heads/--dtype/--batch/--ctx
give the 1B recipe's widths (32, 8, bf16, one sequence of 256).

    python benchmarks/threads.py [--layers 4 --hidden 1024 --intermediate 2816 --vocab 8192]
                                 [--heads 16 --kv-heads 4 --dtype fp32 --no-frozen]
                                 [--batch 4 --ctx 64 --steps 60 --repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = """
[model]
name = "threads-bench"
weights = "random"
seed = 0

[model.config]
architectures = ["LlamaForCausalLM"]
model_type = "llama"
vocab_size = {vocab}
hidden_size = {hidden}
intermediate_size = {intermediate}
num_hidden_layers = {layers}
num_attention_heads = {heads}
num_key_value_heads = {kv_heads}
max_position_embeddings = {ctx}

[serving]
max_model_len = {ctx}
max_num_seqs = {batch}
max_num_batched_tokens = {ctx}
block_size = {ctx}

[compile]
variant = "aoti-package"

[matrix]
platform = ["cpu"]
dtype = ["{dtype}"]
"""


LIBGOMP_DEFAULT = {"GOMP_SPINCOUNT": "300000"}  # libgomp's own default, set so the engine keeps it
SHORT_SPIN = {"GOMP_SPINCOUNT": "1000"}  # what the engine chooses for threads that share cores
ENGINE_WAITS: dict[str, str] = {}  # unset: the serving child chooses as the engine does (runtime.openmp.choose_waits)


def child(root: Path, cores: str, *args: str, waits: dict[str, str] = ENGINE_WAITS) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(waits, TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"), PYTHONPATH=str(REPO))
    done = subprocess.run(
        ["taskset", "-c", cores, sys.executable, "-m", "tests.support.kernel_threads", *args],
        env=env, cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{args[0]} on cores {cores} failed:\n{done.stdout}{done.stderr}")
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 4), ("hidden", 1024), ("intermediate", 2816), ("vocab", 8192)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--no-frozen", action="store_true", help="skip the packages with frozen thread counts")
    for name, default in (("batch", 4), ("ctx", 64), ("steps", 60), ("repeat", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs two cores this process may run on")
    one, two = str(cores[0]), f"{cores[0]},{cores[1]}"
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="prebake-threads-") as tmp:
        root = Path(tmp)
        recipe = root / "threads-bench.toml"
        recipe.write_text(RECIPE.format(**vars(args)))
        shape = json.dumps({"phase": "decode", "batch": args.batch, "tokens": 1, "ctx_len": args.ctx})
        packages = {
            "run-time, baked on 1 core": (root / "dynamic-1", one, []),
            "frozen, baked on 1 core": (root / "static-1", one, ["static"]),
            "frozen, baked on 2 cores": (root / "static-2", two, ["static"]),
        }
        if args.no_frozen:
            packages = {k: v for k, v in packages.items() if k.startswith("run-time")}
        for label, (out, cores_, extra) in packages.items():
            built = child(root, cores_, "build", str(recipe), str(out), shape, *extra)
            print(f"baked {label}: {built['threads']} thread(s), {built['compile_s']} s", flush=True)
        dynamic = packages["run-time, baked on 1 core"][0]
        runs = {
            "run-time/1 core": (dynamic, one, ENGINE_WAITS),
            "run-time/2 cores": (dynamic, two, ENGINE_WAITS),
            "run-time/2 cores, libgomp waits": (dynamic, two, LIBGOMP_DEFAULT),
            "run-time/2 cores, short spin": (dynamic, two, SHORT_SPIN),
        }
        if not args.no_frozen:
            runs["frozen-1/2 cores"] = (packages["frozen, baked on 1 core"][0], two, ENGINE_WAITS)
            runs["frozen-2/2 cores"] = (packages["frozen, baked on 2 cores"][0], two, ENGINE_WAITS)
        rates: dict[str, list[float]] = {k: [] for k in runs}
        per_cpu: dict[str, list[float]] = {k: [] for k in runs}  # tokens per CPU-second: what a loaded host hides
        for _ in range(args.repeat):  # interleaved: a burst of load falls on every configuration
            for label, (out, cores_, waits) in runs.items():
                served = child(root, cores_, "serve", str(recipe), str(out), shape, str(args.steps), waits=waits)
                rates[label].append(served["tokens_per_s"])
                per_cpu[label].append(served["tokens_per_cpu_s"])
                print(
                    f"{label}: {served['tokens_per_s']} tokens/s, {served['tokens_per_cpu_s']} per CPU-second, "
                    f"on {served['threads']} thread(s), "
                    f"{served['waits']}, load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    median = {k: statistics.median(v) for k, v in rates.items()}
    cpu_median = {k: statistics.median(v) for k, v in per_cpu.items()}
    for label, value in median.items():
        print(
            f"{label:>31}: {value:8.2f} decode tokens/s, {cpu_median[label]:8.2f} per CPU-second (runs {rates[label]})"
        )
    two_cores = median["run-time/2 cores"]
    figures = {
        "two_cores_over_one": round(two_cores / median["run-time/1 core"], 3),
        "libgomp_waits_over_engine_waits": round(median["run-time/2 cores, libgomp waits"] / two_cores, 3),
        "short_spin_over_engine_waits": round(median["run-time/2 cores, short spin"] / two_cores, 3),
        # 1.0: the second thread's CPU time all did work; below, it went to waiting (spinning)
        "two_cores_over_one_per_cpu_s": round(cpu_median["run-time/2 cores"] / cpu_median["run-time/1 core"], 3),
    }
    if not args.no_frozen:
        figures["run_time_over_frozen_1"] = round(two_cores / median["frozen-1/2 cores"], 3)
        figures["run_time_over_frozen_2"] = round(two_cores / median["frozen-2/2 cores"], 3)
    load_end = os.getloadavg()
    print(f"a package baked on one core, served on two / on one: {figures['two_cores_over_one']:.2f}x (goal >= 1.5)")
    print(f"the same per CPU-second of all threads: {figures['two_cores_over_one_per_cpu_s']:.2f}x")
    print(
        "on two cores, libgomp's default waits / the engine's choice: "
        f"{figures['libgomp_waits_over_engine_waits']:.2f}x; a short spin / the engine's choice: "
        f"{figures['short_spin_over_engine_waits']:.2f}x"
    )
    if not args.no_frozen:
        print(f"run-time threads / frozen at the builder's 1, on two cores: {figures['run_time_over_frozen_1']:.2f}x")
        print(
            f"run-time threads / frozen at 2 (baked on two cores), on two cores: {figures['run_time_over_frozen_2']:.2f}x"
        )
    print(f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end")
    print(json.dumps({"benchmark": "threads", **vars(args), "tokens_per_s": median, "tokens_per_cpu_s": cpu_median, **figures,
                      "load_average": [round(load_start[0], 2), round(load_end[0], 2)]}))  # fmt: skip


if __name__ == "__main__":
    main()
