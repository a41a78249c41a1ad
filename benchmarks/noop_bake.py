"""A no-op `doit bake` against `doit list` on the same dodo, in one run, as a ratio.

A no-op bake must cost about what loading the dodo costs: computing the keys from package
metadata (no torch import) and one index lookup per task. `doit list` loads the same dodo
and creates the same tasks but checks nothing, so the ratio is the price of the checks.

    python benchmarks/noop_bake.py [--home DIR] [--repeat N] [--model tiny-llama --precision fp32]

Without --home it bakes into a temporary home first (minutes: real torch.compile), then times.
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
DOIT = Path(sys.executable).parent / "doit"


def run(home: Path, *args: str) -> float:
    env = {**os.environ, "PREBAKE_HOME": str(home / "home"), "PREBAKE_TRUSTED_KEYS": ""}
    cmd = [str(DOIT), args[0], "-f", str(REPO / "dodo.py"), "--db-file", str(home / "doit.db"), *args[1:]]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return seconds


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="a folder already baked by this script (reused)")
    parser.add_argument("--repeat", type=positive_int, default=10)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="prebake-noop-"))
    home.mkdir(parents=True, exist_ok=True)
    variables = [f"model={args.model}", f"precision={args.precision}"]
    first = run(home, "run", "bake", *variables)
    print(f"first bake (or check of an existing one): {first:.1f} s")
    bake, listing = [], []
    for _ in range(args.repeat):  # interleaved, so machine noise hits both alike
        bake.append(run(home, "run", "bake", *variables))
        listing.append(run(home, "list", "--all", "bake", *variables))
    mb, ml = statistics.median(bake), statistics.median(listing)
    print(
        f"no-op doit bake: median {mb * 1e3:.0f} ms (min {min(bake) * 1e3:.0f}, max {max(bake) * 1e3:.0f}) over {args.repeat}"
    )
    print(
        f"doit list:       median {ml * 1e3:.0f} ms (min {min(listing) * 1e3:.0f}, max {max(listing) * 1e3:.0f}) over {args.repeat}"
    )
    print(f"ratio no-op bake / doit list: {mb / ml:.2f}")
    print(
        json.dumps(
            {
                "noop_bake_ms": round(mb * 1e3, 1),
                "doit_list_ms": round(ml * 1e3, 1),
                "ratio_noop_to_list": round(mb / ml, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
