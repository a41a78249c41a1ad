"""Decode tokens/s of an AOTInductor package baked on one core, served on one core and on two, in one run.

The package is baked under `taskset -c 0` (a loaded or small builder) and served pinned to one core
and to two, interleaved, medians of --repeat runs; beside it the package as it was before kernels
read their thread count at run time (`cpp.dynamic_threads` off): baked on one core, and baked on
two, both served on two. Ratios within the run, the load average printed beside them.

    python benchmarks/threads.py [--layers 4 --hidden 1024 --intermediate 2816 --vocab 8192]
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
num_attention_heads = 16
num_key_value_heads = 4
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
dtype = ["fp32"]
"""


def child(root: Path, cores: str, *args: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "PYTHONPATH": str(REPO)}
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
        for label, (out, cores_, extra) in packages.items():
            built = child(root, cores_, "build", str(recipe), str(out), shape, *extra)
            print(f"baked {label}: {built['threads']} thread(s), {built['compile_s']} s", flush=True)
        runs = {
            "run-time/1 core": (packages["run-time, baked on 1 core"][0], one),
            "run-time/2 cores": (packages["run-time, baked on 1 core"][0], two),
            "frozen-1/2 cores": (packages["frozen, baked on 1 core"][0], two),
            "frozen-2/2 cores": (packages["frozen, baked on 2 cores"][0], two),
        }
        rates: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.repeat):  # interleaved: a burst of load falls on every configuration
            for label, (out, cores_) in runs.items():
                served = child(root, cores_, "serve", str(recipe), str(out), shape, str(args.steps))
                rates[label].append(served["tokens_per_s"])
                print(f"{label}: {served['tokens_per_s']} tokens/s on {served['threads']} thread(s)", flush=True)
    median = {k: statistics.median(v) for k, v in rates.items()}
    for label, value in median.items():
        print(f"{label:>18}: {value:8.1f} decode tokens/s (runs {rates[label]})")
    figures = {
        "two_cores_over_one": round(median["run-time/2 cores"] / median["run-time/1 core"], 3),
        "run_time_over_frozen_1": round(median["run-time/2 cores"] / median["frozen-1/2 cores"], 3),
        "run_time_over_frozen_2": round(median["run-time/2 cores"] / median["frozen-2/2 cores"], 3),
    }
    load_end = os.getloadavg()
    print(f"a package baked on one core, served on two / on one: {figures['two_cores_over_one']:.2f}x (goal >= 1.5)")
    print(f"run-time threads / frozen at the builder's 1, both on two cores: {figures['run_time_over_frozen_1']:.2f}x")
    print(
        f"run-time threads / frozen at 2 (baked on two cores), on two cores: {figures['run_time_over_frozen_2']:.2f}x"
    )
    print(f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end")
    print(json.dumps({"benchmark": "threads", **vars(args), "tokens_per_s": median, **figures,
                      "load_average": [round(load_start[0], 2), round(load_end[0], 2)]}))  # fmt: skip


if __name__ == "__main__":
    main()
