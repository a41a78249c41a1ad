"""The startup benchmark's bakes at --tp N: `doit bake` of tp 1 and tp N into one registry, and
what each graphs bake cost (its compile step, from graphs.json) and weighs (the bundle's bytes).

A tp=N graphs bake is one process compiling as rank 0 of a fake group (engine/bundled/build.py);
the goal is that it costs what tp 1's does: <= 1.1x the compile step and the bundle's bytes.

Run alone (`python -m benchmarks.tp_bakes --recipes FOLDER --model M --rounds R`), it bakes tp 1 and
tp N R times each, interleaved ABBA (tp 1, N, N, 1, ...), every bake cold (its own home, doit
database and registry), and prints the medians' ratios: the like-for-like figure on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def with_tp(toml: str, tp: int) -> str:
    """The recipe text with [matrix] tp = [1, tp]."""
    toml = re.sub(r"^tp\s*=.*\n", "", toml, flags=re.M)
    return re.sub(r"^\[matrix\]\s*$", f"[matrix]\ntp = [1, {tp}]", toml, count=1, flags=re.M)


def bake(bin_dir: Path, recipes: Path, registry: Path, model: str, precision: str, tp: int, work: Path) -> dict:
    """Bake tp 1 and tp `tp` (in that order) into `registry`; per tp: compile seconds, bundle bytes, bake seconds."""
    return {size: bake_one(bin_dir, recipes, registry, model, precision, size, work) for size in (1, tp)}


def bake_one(bin_dir: Path, recipes: Path, registry: Path, model: str, precision: str, tp: int, work: Path) -> dict:
    """`doit bake` of one tp into `registry`, home `work/baker`: compile seconds, bundle bytes, bake seconds."""
    registry.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
    env.update(PREBAKE_HOME=str(work / "baker"), PREBAKE_RECIPES=str(recipes), PREBAKE_TRUSTED_KEYS="")
    print(f"baking {model} {precision} tp {tp} through doit bake ...", flush=True)
    started = time.perf_counter()
    done = subprocess.run(
        [str(bin_dir / "doit"), "-f", str(REPO / "dodo.py"), "--db-file", str(work / "doit.db"), "bake"]
        + [f"model={model}", f"precision={precision}", f"tp={tp}", f"registry={registry}"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"doit bake of tp {tp} failed:\n{done.stdout}\n{done.stderr}")
    out = {"bake_s": round(time.perf_counter() - started, 3), **_graphs(bin_dir, env, registry, model, precision, tp)}
    print(f"  tp {tp}: {out} (load {os.getloadavg()[0]:.1f})", flush=True)
    return out


def _graphs(bin_dir: Path, env: dict, registry: Path, model: str, precision: str, tp: int) -> dict:
    entry = next(
        e
        for e in sorted(registry.glob("index/graphs/*.json"))
        if str(json.loads(e.read_text())["key"]["parallel"]["tp"]) == str(tp)
    )
    home = Path(tempfile.mkdtemp(prefix=f"fetch-tp{tp}-"))
    fetched = subprocess.run(
        [str(bin_dir / "prebake"), "fetch", "--model", model, "--precision", precision, "--tp", str(tp)]
        + ["--registry", str(registry), "--json"],
        env={**env, "PREBAKE_HOME": str(home)},
        capture_output=True,
        text=True,
        check=True,
    )
    tree = Path(json.loads(fetched.stdout)["bundles"]["graphs"]["tree"])
    document = json.loads((tree / "graphs.json").read_text())
    return {
        "compile_s": document["total_compile_s"],
        "bundle_bytes": int(json.loads(entry.read_text())["blob"]["size"]),
    }


def summary(bakes: dict, tp: int) -> dict:
    """tp N's compile step and bundle bytes over tp 1's."""
    one, many = bakes[1], bakes[tp]
    return {
        "by_tp": {str(k): v for k, v in bakes.items()},
        "compile_over_tp1": round(many["compile_s"] / one["compile_s"], 3),
        "bundle_over_tp1": round(many["bundle_bytes"] / one["bundle_bytes"], 3),
    }


def order(rounds: int, tp: int) -> list[int]:
    """ABBA: tp 1, N, N, 1, 1, N, ... (`rounds` bakes of each), so a drift in load falls on both."""
    pairs = [(1, tp) if r % 2 == 0 else (tp, 1) for r in range(rounds)]
    return [size for pair in pairs for size in pair]


def interleaved(bakes: list[tuple[int, dict]], tp: int) -> dict:
    """Medians per tp of compile seconds and bundle bytes, and tp N's over tp 1's."""
    median = {
        size: {f: statistics.median(b[f] for s, b in bakes if s == size) for f in ("compile_s", "bundle_bytes")}
        for size in (1, tp)
    }
    return {
        "rounds": [{"tp": s, **b} for s, b in bakes],
        "median": {str(k): v for k, v in median.items()},
        "compile_over_tp1": round(median[tp]["compile_s"] / median[1]["compile_s"], 3),
        "bundle_over_tp1": round(median[tp]["bundle_bytes"] / median[1]["bundle_bytes"], 3),
    }


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", type=Path, required=True, help="the folder holding the model's recipe")
    parser.add_argument("--model", required=True)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--rounds", type=positive_int, default=2, help="bakes of each tp (default 2)")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tp-bakes-"))
    recipes = work / "recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    source = (args.recipes / f"{args.model}.toml").read_text()
    (recipes / f"{args.model}.toml").write_text(with_tp(source, args.tp))
    bin_dir = Path(sys.executable).parent
    bakes = []
    for i, size in enumerate(order(args.rounds, args.tp)):
        own = work / f"bake-{i}-tp{size}"
        bakes.append((size, bake_one(bin_dir, recipes, own / "registry", args.model, args.precision, size, own)))
    figures = interleaved(bakes, args.tp)
    print(
        f"tp {args.tp} / tp 1 over {args.rounds} interleaved rounds (medians): compile step "
        f"{figures['compile_over_tp1']:.3f}x, graphs bundle {figures['bundle_over_tp1']:.3f}x"
    )
    print(json.dumps({"benchmark": "tp_bakes", "model": args.model, "precision": args.precision, **figures}))


if __name__ == "__main__":
    main()
