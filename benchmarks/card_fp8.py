"""The design card's command, `doit bake model=llama3-8b precision=fp8`, then one answer served from
its bundle (issue 47's goal: the bake's peak RSS <= 4 GB; start and first token times recorded).

    python -m benchmarks.card_fp8 [--model llama3-8b] [--precision fp8] [--tokens 4] [--work DIR]

A fresh PREBAKE_HOME and registry: `doit bake` timed, its peak resident set (the largest process of
its tree: getrusage's ru_maxrss over the waited-for children, what `/usr/bin/time -v` reports);
then `prebake serve --on-miss fail` from that registry (a random checkpoint is written once inside
the start where the home has none: 8.5 GiB for the 8B at fp8), its time to ready, one greedy token
of a 24-token prompt, then --tokens. Printed: the figures, peak / goal, and as the last line one JSON
object. Heavy for the 8B on a CPU that emulates FP8: minutes (docs/performance.md has a run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.clients import REPO, start_server

GOAL_BYTES = 4e9  # the bound on the bake's peak RSS
PROMPT = "The capital of France is"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--precision", default="fp8")
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="prebake-card-"))
    work.mkdir(parents=True, exist_ok=True)
    registry = work / "registry"
    load = os.getloadavg()

    bake_s, peak = bake(args.model, args.precision, registry, work)
    print(f"doit bake model={args.model} precision={args.precision}: {bake_s:.1f} s, peak RSS {peak / 1e9:.2f} GB "
          f"({peak / GOAL_BYTES:.2f}x the 4 GB goal)", flush=True)  # fmt: skip

    started = time.perf_counter()
    serve_args = ["--precision", args.precision, "--on-miss", "fail", "--registry", str(registry)]
    server = start_server(args.model, serve_args, work)
    ready_s = time.perf_counter() - started
    try:
        first_s, first = complete(server.url, args.model, 1)
        more_s, more = complete(server.url, args.model, args.tokens)
    finally:
        server.stop()
    print(f"prebake serve --on-miss fail: ready {ready_s:.1f} s; one token {first_s:.1f} s {first}; "
          f"{args.tokens} tokens {more_s:.1f} s {more}", flush=True)  # fmt: skip
    print(json.dumps({
        "benchmark": "card_fp8", "model": args.model, "precision": args.precision, "bake_s": round(bake_s, 1),
        "bake_peak_rss_bytes": peak, "bake_peak_over_goal": round(peak / GOAL_BYTES, 3),
        "ready_s": round(ready_s, 1), "first_token_s": round(first_s, 1), "tokens": args.tokens,
        "tokens_s": round(more_s, 1), "token_ids": more, "first_is_prefix": more[:1] == first,
        "load_average": [round(x, 2) for x in load],
    }))  # fmt: skip


def bake(model: str, precision: str, registry: Path, work: Path) -> tuple[float, int]:
    """`doit bake` into `registry` with this work folder's home; its seconds and peak RSS in bytes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
    env |= {"PREBAKE_HOME": str(work / "home"), "PREBAKE_RECIPES": str(REPO / "recipes"), "PREBAKE_TRUSTED_KEYS": ""}
    doit = Path(sys.executable).parent / "doit"
    command = [str(doit), "run", "-f", str(REPO / "dodo.py"), "--db-file", str(work / "doit.db"), "bake"]
    command += [f"model={model}", f"precision={precision}", f"registry={registry}"]
    started = time.perf_counter()
    with (work / "bake.log").open("w") as log:
        done = subprocess.run(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"doit bake exited {done.returncode}: see {work / 'bake.log'}")
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: kilobytes


def complete(url: str, model: str, tokens: int) -> tuple[float, list[int]]:
    """One greedy completion of PROMPT; its seconds and token ids."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0}
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as response:
        answer = json.load(response)
    return time.perf_counter() - started, list(answer["choices"][0]["token_ids"])


if __name__ == "__main__":
    main()
