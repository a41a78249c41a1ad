"""How prebake's costs grow with the model: tiny-llama, the 1B recipe and llama3-8b, on this CPU.

Per model, bf16: the bake (`doit bake`, the README's command: its seconds in all and per step shape,
its peak RSS: the largest process of the bake, g++ included, and the graphs bundle's bytes), then
starts of `prebake serve`, each a fresh process with an empty store (the recipe's random checkpoint,
written once beforehand, is shared through a link in each home's models/): eager (--eager, the
floor), prebaked (the bake's bundles) and cold (an empty registry: compiled in place), each by part
(weights: the load step; package load and bind; first runs); then decode tokens/s of the prebaked
and the eager server (one sequence, greedy). The figures of merit, per model:

    prebaked / eager (time to ready)      compile overhead removed: (cold - prebaked) / (cold - eager)
    decode tokens/s, prebaked / eager     bake peak RSS, bytes of the model's weights

    python benchmarks/scale.py [--models tiny-llama,llama3.2-1b,llama3-8b] [--work DIR]
                               [--iterations 1] [--tokens 16] [--json results.json] [--chart scale.png]

A model's bake and checkpoint are kept in --work (reused by a later run with the same --work).
The output ends with one JSON line.
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
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from a checkout: benchmarks/ is no package
from benchmarks.startup import (  # noqa: E402
    PREBAKE,
    _get,
    _startup_steps,
    _time_completion,
    _wait_for_port,
    _wait_ready,
    _warm_up_parts,
)

DOIT = Path(sys.executable).parent / "doit"
MODELS = ("tiny-llama", "llama3.2-1b", "llama3-8b")
PRECISION = "bf16"


def main() -> None:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="recipes, joined by commas")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument("--iterations", type=positive_int, default=1, help="eager and prebaked starts per model")
    parser.add_argument("--cold", type=int, default=1, help="cold starts per model (0: none)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens decoded to time decode tokens/s")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--chart", type=Path, help="draw the scale curve into this PNG")
    parser.add_argument("--precision", default=PRECISION, help="bf16, or fp8 (the FP8 twin of the checkpoint)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="prebake-scale-"))
    rows = {}
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        rows[model] = measure(model, work / model, args)
        print(render(model, rows[model]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.chart:
        from benchmarks import charts

        charts.scale(rows, args.chart)
    print(json.dumps({"benchmark": "scale", "models": rows, "load_average": _load()}))


def measure(model: str, work: Path, args) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    bake = _bake(model, work, args.precision)
    checkpoint = _checkpoint(model, work, args.precision)
    starts: dict[str, list[dict]] = {"eager": [], "prebaked": [], "cold": []}
    for i in range(max(args.iterations, args.cold)):
        for mode in ("eager", "prebaked", "cold"):
            if i < (args.cold if mode == "cold" else args.iterations):
                starts[mode].append(_start(model, work, mode, i, args.tokens, args.precision))
                (work / "starts.json").write_text(json.dumps(starts, indent=1))  # kept as they come
    mean = {mode: _mean_start(runs) for mode, runs in starts.items() if runs}
    row: dict[str, object] = {
        "bake": bake,
        "checkpoint": checkpoint,
        "starts": mean,
        "load_average": _load(),
        "precision": args.precision,
    }
    ready = {mode: m["ready_s"] for mode, m in mean.items()}
    if "eager" in ready and "prebaked" in ready:
        row["prebaked_over_eager"] = round(ready["prebaked"] / ready["eager"], 3)
        decode = (mean["prebaked"]["decode_tokens_per_s"], mean["eager"]["decode_tokens_per_s"])
        row["decode_prebaked_over_eager"] = round(decode[0] / decode[1], 3) if None not in decode else None
    if "cold" in ready and "eager" in ready and "prebaked" in ready:
        row["overhead_removed"] = round((ready["cold"] - ready["prebaked"]) / (ready["cold"] - ready["eager"]), 4)
    return row


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
    return {**env, "PREBAKE_HOME": str(home), "PREBAKE_TRUSTED_KEYS": "", **extra}


def _bake(model: str, work: Path, precision: str = PRECISION) -> dict:
    """`doit bake model=M precision=P` into work/registry, once; its figures (kept in bake.json)."""
    done = work / "bake.json"
    if done.is_file():
        return json.loads(done.read_text())
    registry, home = work / "registry", work / "bake-home"
    print(f"baking {model} {precision} ...", flush=True)
    command = [str(DOIT), "bake", f"model={model}", f"precision={precision}", f"registry={registry}"]
    started = time.perf_counter()
    peak = _peak_rss_of(command, _env(home), work / "bake.log")
    seconds = time.perf_counter() - started
    graphs = json.loads(next(home.rglob("graphs.json")).read_text())
    autotune = json.loads(next(home.rglob("autotune.json")).read_text())
    figures = {
        "seconds": round(seconds, 1),
        "compile_s": graphs["total_compile_s"],
        "per_shape_s": {_shape_name(s["shape"]): s["compile_s"] for s in graphs["shapes"]},
        "peak_rss_bytes": peak,
        "graphs_peak_rss_bytes": graphs.get("builder", {}).get("peak_rss_bytes"),
        "autotune_peak_rss_bytes": autotune.get("model", {}).get("peak_rss_bytes"),
        "autotune_layers": autotune.get("model", {}).get("layers"),
        "graphs_bundle_bytes": _bundle_bytes(registry),
        "load_average": _load(),
    }
    done.write_text(json.dumps(figures, indent=1))
    return figures


def _peak_rss_of(command: list[str], env: dict[str, str], log: Path) -> int:
    """Run `command`; the peak RSS of its largest process, in bytes (ru_maxrss of its waited-for
    descendants, read in a wrapper of its own so no other child of this script counts)."""
    wrapper = (
        "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
    )
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-c", wrapper, *command], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=out, text=True
        )
    log.write_text(log.read_text() + done.stdout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed (exit {done.returncode}); its log is {log}")
    return int(done.stdout.strip().splitlines()[-1]) * 1024


def _checkpoint(model: str, work: Path, precision: str = PRECISION) -> dict:
    """The recipe's random checkpoint (at fp8 its FP8 twin) written once into work/models (a no-op when
    it is there)."""
    code = (
        "import json, sys, time; from pathlib import Path; "
        "from prebake.artifacts.recipe.schema import load_recipe; "
        "from prebake.engine.bundled.runtime.checkpoint import random_checkpoint; "
        "spec = load_recipe(sys.argv[1]).model; t = time.perf_counter(); "
        "c = random_checkpoint(spec, Path(sys.argv[2]), fp8=sys.argv[3] == 'fp8') "
        "if spec.weights == 'random-checkpoint' else None; "
        "print(json.dumps({'written': bool(c and c.written), 'seconds': round(time.perf_counter() - t, 1), "
        "'bytes': sum(f.stat().st_size for f in c.folder.glob('*.safetensors')) if c else None}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, model, str(work), precision], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _start(model: str, work: Path, mode: str, iteration: int, tokens: int, precision: str = PRECISION) -> dict:
    run = Path(tempfile.mkdtemp(prefix=f"{mode}-{iteration}-", dir=work))
    home = run / "home"
    home.mkdir()
    if (work / "models").is_dir():
        (home / "models").symlink_to(work / "models")  # the checkpoint, written once; the store stays empty
    registry = work / "registry" if mode != "cold" else run / "empty-registry"
    registry.mkdir(exist_ok=True)
    extra = ["--eager"] if mode == "eager" else []
    command = [
        str(PREBAKE),
        "serve",
        "--model",
        model,
        "--precision",
        precision,
        "--port",
        "0",
        "--registry",
        str(registry),
        *extra,
    ]
    log = run / "serve.log"
    with log.open("w+") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(command, env=_env(home), cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            port = _wait_for_port(proc, log)
            _wait_ready(proc, port, log)
            ready = time.perf_counter() - started
            metrics = _get(port, "/metrics")[1]
            decode = _decode_tokens_per_s(port, tokens)
        finally:
            proc.terminate()
            proc.wait(300)
    steps, parts = _startup_steps(metrics), _warm_up_parts(metrics)
    if mode == "prebaked" and steps.get("compile", 0.0) > 0:
        sys.exit(f"the prebaked start of {model} compiled: no matching bundle in {registry}; see {log}")
    print(f"  {model} {mode:<8} #{iteration}: ready {ready:7.2f} s, decode {_tokens_per_s(decode)}", flush=True)
    return {"ready_s": ready, "steps": steps, "parts": parts, "decode_tokens_per_s": decode}


def _decode_tokens_per_s(port: int, tokens: int) -> float | None:
    """Greedy decode speed of one sequence: (tokens - 1) over the time a request of `tokens` takes
    beyond a request of one token (its prefill and first token), the faster of two tries each; None
    when the longer request took no longer (a burst of load fell on the short one: not measured)."""
    one = min(_complete(port, 1)[0] for _ in range(2))
    many, made = min(_complete(port, tokens) for _ in range(2))
    return (made - 1) / (many - one) if many > one and made > 1 else None


def _tokens_per_s(decode: float | None) -> str:
    return "not measured (the longer request took no longer)" if decode is None else f"{decode:6.2f} tokens/s"


def _complete(port: int, tokens: int) -> tuple[float, int]:
    seconds, body = _time_completion(port, tokens)
    return seconds, int(json.loads(body)["usage"]["completion_tokens"])


def _mean_start(runs: list[dict]) -> dict:
    def mean(values: Iterable[float | None]) -> float | None:
        measured = [v for v in values if v is not None]  # a decode speed not measured is left out
        return round(sum(measured) / len(measured), 3) if measured else None

    steps = sorted({s for r in runs for s in r["steps"]})
    parts = sorted({p for r in runs for p in r["parts"]})
    return {
        "n": len(runs),
        "ready_s": mean(r["ready_s"] for r in runs),
        "weights_s": mean(r["steps"].get("load", 0.0) for r in runs),
        "steps": {s: mean(r["steps"].get(s, 0.0) for r in runs) for s in steps},
        "parts": {p: mean(r["parts"].get(p, 0.0) for r in runs) for p in parts},
        "decode_tokens_per_s": mean(r["decode_tokens_per_s"] for r in runs),
    }


def _bundle_bytes(registry: Path) -> int | None:
    for entry in sorted(registry.glob("index/graphs/*.json")):
        return int(json.loads(entry.read_text())["blob"]["size"])
    return None


def _shape_name(shape: dict) -> str:
    return f"{shape['phase']}-b{shape['batch']}-t{shape['tokens']}-c{shape['ctx_len']}"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def render(model: str, row: dict) -> str:
    bake, starts = row["bake"], row["starts"]
    lines = [
        f"{model} {row.get('precision', PRECISION)}: bake {bake['seconds']:.1f} s (compile {bake['compile_s']:.1f} s over "
        f"{len(bake['per_shape_s'])} shapes), peak RSS {bake['peak_rss_bytes'] / 2**30:.2f} GiB "
        f"(graphs {(bake['graphs_peak_rss_bytes'] or 0) / 2**30:.2f}, autotune "
        f"{(bake['autotune_peak_rss_bytes'] or 0) / 2**30:.2f}), graphs bundle {(bake['graphs_bundle_bytes'] or 0) / 1e6:.2f} MB",
    ]
    for mode, m in starts.items():
        parts = ", ".join(f"{p} {s:.2f}" for p, s in m["parts"].items())
        lines.append(
            f"  {mode:<8} ready {m['ready_s']:8.2f} s (weights {m['weights_s']:.2f} s; {parts}); "
            f"decode {_tokens_per_s(m['decode_tokens_per_s'])}"
        )
    for name in ("prebaked_over_eager", "overhead_removed", "decode_prebaked_over_eager"):
        if name in row:
            lines.append(f"  {name}: {row[name]}")
    lines.append(f"  load average {row['load_average']}")
    return "\n".join(lines)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashed child leaves no multi-gigabyte core file
    main()
