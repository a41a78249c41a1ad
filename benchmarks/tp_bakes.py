"""The startup benchmark's bakes at --tp N: `doit bake` of tp 1 and tp N into one registry, and
what each graphs bake cost (its compile step, from graphs.json) and weighs (the bundle's bytes).

A tp=N graphs bake is one process compiling as rank 0 of a fake group (engine/bundled/build.py);
the goal is that it costs what tp 1's does: <= 1.1x the compile step and the bundle's bytes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
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
    registry.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
    env.update(PREBAKE_HOME=str(work / "baker"), PREBAKE_RECIPES=str(recipes), PREBAKE_TRUSTED_KEYS="")
    out: dict = {}
    for size in (1, tp):
        print(f"baking {model} {precision} tp {size} through doit bake ...", flush=True)
        started = time.perf_counter()
        done = subprocess.run(
            [str(bin_dir / "doit"), "-f", str(REPO / "dodo.py"), "--db-file", str(work / "doit.db"), "bake"]
            + [f"model={model}", f"precision={precision}", f"tp={size}", f"registry={registry}"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"doit bake of tp {size} failed:\n{done.stdout}\n{done.stderr}")
        out[size] = {
            "bake_s": round(time.perf_counter() - started, 3),
            **_graphs(bin_dir, env, registry, model, precision, size),
        }
        print(f"  tp {size}: {out[size]}", flush=True)
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
