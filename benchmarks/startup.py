"""Start-up of the bundled engine: cold, prebaked and eager, after vLLM's startup benchmark.

Every start is a fresh `prebake serve` subprocess with an empty store, timed from spawn until
/health says 200, then one completion. Modes: cold (an empty registry: everything built in
place), prebaked (the recipe's bundles in a local registry), eager (--eager: the floor).
Figure of merit, on the mean time to ready, per graphs variant ([compile] variant):

    (cold - prebaked) / (cold - eager)          target >= 0.97 on tiny-llama, default variant

Each variant's bundles are made first by one cold start with --write-back (its bake), its compile
step and graphs bundle reported per variant. Modes are interleaved per iteration.

    python benchmarks/startup.py [--model tiny-llama] [--precision fp32] [--variant both|all|V[,V...]]
                                 [--iterations 3] [--warm-iterations N] [--cold-from-bake]
                                 [--json results.json] [--work DIR] [--tp N]
--variant's default is the recipe's own variant, the one its users start (aoti-package for tiny-llama).
At --tp N: every start `serve --tp N`, the bakes `doit bake` of tp 1 and N compared (tp_bakes.py).

The output ends with one JSON line: overhead removed per variant and for the recipe's default
variant, mean time to ready of every mode, the bakes' compile seconds and bundle bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from a checkout: benchmarks/ is no package
from benchmarks import snapshot_mode, tp_bakes  # noqa: E402
from benchmarks.bytecode import compile_prebake  # noqa: E402
from prebake.artifacts.store.settings import default_home  # noqa: E402
from prebake.engine.bundled.runtime.gguf_fetch import downloads_dir  # noqa: E402

PREBAKE = Path(sys.executable).parent / "prebake"
VARIANTS = ("inductor-cache", "dynamo-precompile", "aoti-package")
VARIANT_SETS = {"both": ("inductor-cache", "dynamo-precompile"), "all": VARIANTS}  # --variant's names for several
PROMPT = list(range(1, 17))


@dataclass
class Run:
    mode: str
    variant: str
    ready_s: float
    first_request_s: float
    steps: dict[str, float] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)  # the warm-up step's parts
    tokens: list[int] = field(default_factory=list)  # the first completion's greedy tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument(
        "--variant",
        type=_variants,
        default=(),
        help=f"one of {', '.join(VARIANTS)}, several joined by commas, or {' or '.join(VARIANT_SETS)} "
        "(default: the recipe's own variant, aoti-package for the shipped recipes)",
    )
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument(
        "--warm-iterations",
        type=int,
        default=0,
        help="after the iterations, this many more eager and prebaked starts (interleaved; no cold one): "
        "a tighter prebaked / eager ratio for the price of seconds, not minutes",
    )
    parser.add_argument("--json", type=Path, help="also write every run and the summary here")
    parser.add_argument("--chart", type=Path, help="draw seconds per start-up step of every mode into this PNG")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument(
        "--registry",
        type=Path,
        help="a registry that already holds the recipe's bundles (e.g. $PREBAKE_HOME/registry after "
        "`doit bake`): prebaked starts use it and nothing is baked; benchmarks the recipe's own variant",
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every start (default 1)")
    parser.add_argument("--show-completion", action="store_true", help="print each prebaked start's first completion")
    parser.add_argument(
        "--chat", help="ask each prebaked start this chat question; print its answer beside the figures"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        help="cut the recipe's serving limits to one sequence of this many tokens: fewer step shapes to bake",
    )
    parser.add_argument(
        "--cold-from-bake",
        action="store_true",
        help="count each variant's bake (a cold start with --write-back, whose time to ready also holds "
        "the few seconds of packing and publishing) as its first cold start, instead of starting cold again",
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="also bake the recipe's process snapshot ([snapshot] bake = true; needs CRIU, docs/snapshots.md) and "
        "time its restore (`serve --snapshot require`) beside the other modes (snapshot_mode.py)",
    )
    args = parser.parse_args()
    if min(args.iterations, args.warm_iterations) < 0 or args.iterations + args.warm_iterations < 1:
        parser.error(  # before any bake: a run that times nothing is found out now, not after minutes
            f"--iterations {args.iterations} --warm-iterations {args.warm_iterations} times no start: "
            "give --iterations 1 or more (cold, prebaked and eager), or --warm-iterations 1 or more (no cold one)"
        )
    print(f"prebake's bytecode brought up to date in {compile_prebake():.1f} s (benchmarks/bytecode.py)", flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="prebake-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work, args.model, args.precision, show=args.show_completion, tp=args.tp, snapshot=args.snapshot)
    variants = args.variant or default_variants(args.model)
    bench.chat, bench.max_model_len = args.chat, args.max_model_len
    bench.prepare_weights()
    if args.registry:
        variants = default_variants(args.model)
        bench.registries[variants[0]] = args.registry
    runs: list[Run] = []
    for variant in variants:
        baked = bench.bake(variant)
        if baked is not None:
            bench.bakes[variant] = baked
        if args.cold_from_bake and baked is not None:
            runs.append(Run("cold", variant, baked.ready_s, baked.first_request_s, baked.steps, baked.parts))
    if args.snapshot:
        bench.snapshot_s = snapshot_mode.bake(
            PREBAKE.parent,
            REPO,
            bench.recipes(variants[0]),
            bench.registry(variants[0]),
            args.model,
            args.precision,
            work,
        )
    for i in range(args.iterations):
        runs.append(bench.start("eager", variants[0], i))  # the floor compiles nothing: one per iteration
        if args.snapshot:
            runs += [bench.start(mode, variants[0], i) for mode in snapshot_mode.MODES]
        for variant in variants:
            if not (args.cold_from_bake and i == 0 and any(r.mode == "cold" and r.variant == variant for r in runs)):
                runs.append(bench.start("cold", variant, i))
            runs.append(bench.start("prebaked", variant, i))
    for i in range(args.iterations, args.iterations + args.warm_iterations):  # more of the fast modes, interleaved
        runs.append(bench.start("eager", variants[0], i))
        if args.snapshot:
            runs += [bench.start(mode, variants[0], i) for mode in snapshot_mode.MODES]
        for variant in variants:
            runs.append(bench.start("prebaked", variant, i))
    summary = summarise(runs, variants)
    bakes = bake_summary(bench, variants)
    print(render(summary, args, bakes))
    for question, answer in dict(bench.answers).items():
        print(f"\n{args.model} ({args.precision}, prebaked) asked {question!r}:\n  {answer}")
    restored = {}
    if args.snapshot:
        tokens = {
            mode: [r.tokens for r in runs if r.mode == mode and r.variant == variants[0]]
            for mode in ("snapshot", "prebaked")
        }
        restored = snapshot_mode.figures(summary, variants[0], tokens, bench.registry(variants[0]))
        restored["snapshot_bake_s"] = round(bench.snapshot_s, 3)
        print(snapshot_mode.render(restored))
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], "summary": summary}, indent=1))
    if args.chart:
        sys.path.insert(0, str(REPO))  # run as a script from a checkout: benchmarks/ is no package
        from benchmarks import charts

        charts.startup(summary, args.chart, title=f"{args.model} {args.precision} start-up by step")
    print(json.dumps(figures(summary, variants, args, bakes) | restored))


def figures(summary: dict, variants, args, bakes: dict) -> dict:
    """The run's figures under stable names: the last line of the output."""
    default = _recipe_variant(_recipe_path(args.model).read_text())
    removed = {v: round(r["mean"], 4) for v in variants if (r := summary[v].get("compile_overhead_removed"))}
    return {
        "benchmark": "startup",
        "model": args.model,
        "precision": args.precision,
        "iterations": args.iterations,
        "warm_iterations": args.warm_iterations,
        "cold_from_bake": args.cold_from_bake,
        "default_variant": default,
        "overhead_removed_default": removed.get(default),
        "overhead_removed": removed,
        "overhead_removed_p50": {
            v: round(r["p50"], 4) for v in variants if (r := summary[v].get("compile_overhead_removed"))
        },
        "ready_mean_s": {
            "eager": round(summary["eager"]["ready_s"]["mean"], 3),
            **{f"{m}_{v}": round(summary[v][m]["ready_s"]["mean"], 3) for v, m in _modes_of(summary, variants)},
        },
        "prebaked_over_eager": {
            v: round(summary[v]["prebaked"]["ready_s"]["mean"] / summary["eager"]["ready_s"]["mean"], 3)
            for v in variants
        },
        # every mode's mean seconds per start-up step, and per part of its warm-up step
        "steps_mean_s": {
            "eager": _rounded(summary["eager"]["steps_mean_s"]),
            **{f"{m}_{v}": _rounded(summary[v][m]["steps_mean_s"]) for v, m in _modes_of(summary, variants)},
        },
        "parts_mean_s": {
            "eager": _rounded(summary["eager"]["parts_mean_s"]),
            **{f"{m}_{v}": _rounded(summary[v][m]["parts_mean_s"]) for v, m in _modes_of(summary, variants)},
        },
        "prebaked_beyond_eager_s": {v: beyond_eager(summary[v]["prebaked"], summary["eager"]) for v in variants},
        # each bake's compile step (compile_graphs of every shape), seconds, and its graphs bundle's bytes;
        # the ratios are to dynamo-precompile's of the same run
        **{f"bake_{name}": value for name, value in bakes.items()},
        "tp": args.tp,
        **({"bake_tp": tp_bakes.summary(bakes["tp"], args.tp)} if "tp" in bakes else {}),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in values.items()}


class Bench:
    """Recipes per variant, their registries, and one fresh serving process per measurement."""

    def __init__(self, work: Path, model: str, precision: str, show: bool = False, tp: int = 1, snapshot: bool = False):
        self.work, self.model, self.precision, self.show, self.tp = work, model, precision, show, tp
        self.snapshot = snapshot  # the recipe bakes a process snapshot; only the snapshot mode restores it
        self.snapshot_s = 0.0
        self.tp_bakes: dict = {}  # at --tp N: {1: ..., N: ...} from benchmarks/tp_bakes.py
        self.registries: dict[str, Path] = {}  # variant -> a registry given by the caller
        self.bakes: dict[str, Run] = {}  # variant -> the cold start with --write-back that baked it here
        self.chat: str | None = None  # a chat question for each prebaked start
        self.max_model_len: int | None = None  # the recipe's serving limits cut to one sequence this long
        self.answers: list[tuple[str, str]] = []  # (question, a prebaked start's answer)
        self.models_home = default_home()  # whose models/ every start maps

    def prepare_weights(self) -> None:
        """Weights a start reads from a folder made once (a GGUF dequantized, a random checkpoint or its
        FP8 twin): made here, before any start is timed, in $PREBAKE_HOME/models, which every start's
        fresh store shares (once a machine)."""
        from prebake.artifacts.recipe.schema import RANDOM_CHECKPOINT, load_recipe
        from prebake.engine.bundled.runtime.loader import model_folder

        spec = load_recipe(self.recipes(_recipe_variant(_recipe_path(self.model).read_text())) / f"{self.model}.toml")
        if spec.model.weights == RANDOM_CHECKPOINT:
            from prebake.engine.bundled.runtime.checkpoint import random_checkpoint

            random_checkpoint(spec.model, self.models_home, fp8=self.precision == "fp8")
            return
        if spec.model.gguf is None:
            return
        from prebake.engine.bundled.runtime.gguf_folder import gguf_folder
        from prebake.engine.bundled.runtime.loader import torch_dtype

        folder = model_folder(spec.model, self.precision, self.models_home)
        if folder is None or not (folder / "config.json").is_file():
            gguf_folder(spec.model, torch_dtype(self.precision), self.models_home)

    def graphs_bundle_bytes(self, variant: str) -> int | None:
        """The size of the graphs bundle (its compressed blob) in the variant's registry."""
        for entry in sorted(self.registry(variant).glob("index/graphs/*.json")):
            return int(json.loads(entry.read_text())["blob"]["size"])
        return None

    def recipes(self, variant: str) -> Path:
        folder = self.work / variant / "recipes"
        if not folder.is_dir():
            folder.mkdir(parents=True)
            source = _with_variant(_recipe_path(self.model).read_text(), variant)
            source = snapshot_mode.with_snapshot(source) if self.snapshot else source
            source = _with_dtype(source, self.precision)
            if self.max_model_len:
                source = _with_one_sequence(source, self.max_model_len)
            (folder / f"{self.model}.toml").write_text(source if self.tp == 1 else tp_bakes.with_tp(source, self.tp))
        return folder

    def registry(self, variant: str) -> Path:
        return self.registries.get(variant) or self.work / variant / "registry"

    def bake(self, variant: str) -> Run | None:
        """One cold start with --write-back fills the variant's registry; its run (None if already baked)."""
        if self.tp > 1:  # a process per bake (rank 0 of a fake group), tp 1 beside it; doit skips what is done
            self.tp_bakes = tp_bakes.bake(
                PREBAKE.parent,
                self.recipes(variant),
                self.registry(variant),
                self.model,
                self.precision,
                self.tp,
                self.work,
            )
            return None
        if any(self.registry(variant).glob("index/graphs/*.json")):
            return None
        self.registry(variant).mkdir(parents=True, exist_ok=True)
        print(
            f"baking {self.model} {self.precision} ({variant}) through a cold start with --write-back ...", flush=True
        )
        # the benchmark is its registry's builder: its write-back goes to the index, not to quarantine
        # (registry/review/writeback.py), or no prebaked start would find the bundles
        bake = ["--registry", str(self.registry(variant)), "--write-back"]
        run = self._serve(variant, "bake", bake, env={"PREBAKE_WRITE_BACK": "index"})
        if not any(self.registry(variant).glob("index/graphs/*.json")):
            sys.exit(
                f"the bake published no graphs bundle into {self.registry(variant)}: see its serve.log under {self.work}"
            )
        print(f"  baked in {run.ready_s:.1f} s", flush=True)
        return run

    def start(self, mode: str, variant: str, iteration: int) -> Run:
        if mode == "cold":
            empty = self.work / variant / f"empty-registry-{iteration}"
            empty.mkdir(parents=True, exist_ok=True)
            extra = ["--registry", str(empty)]
        else:
            extra = ["--registry", str(self.registry(variant))] + (["--eager"] if mode == "eager" else [])
        if self.snapshot:  # the restore in its own modes only; it fails loudly there rather than fall back
            extra += ["--snapshot", "require" if mode in snapshot_mode.MODES else "never"]
        home = None
        if mode == snapshot_mode.STORED:  # one store kept across its starts, filled by an untimed first one
            home = self.work / "snapshot-store"
            if not home.exists():
                self._serve(variant, mode, extra, tag="filling", env=snapshot_mode.criu_env(), home=home)
        run = self._serve(variant, mode, extra, tag=str(iteration), env=snapshot_mode.criu_env(), home=home)
        if mode == "prebaked" and run.steps.get("compile", 0.0) > 0:
            sys.exit(
                f"the prebaked start of {variant} #{iteration} compiled ({run.steps['compile']:.1f} s): the registry "
                f"{self.registry(variant)} has no matching bundle for it; see its serve.log under {self.work}"
            )
        print(
            f"  {mode:<9} {variant:<15} #{iteration}: ready {run.ready_s:7.2f} s, first request "
            f"{run.first_request_s * 1e3:7.1f} ms",
            flush=True,
        )
        return run

    def _serve(
        self,
        variant: str,
        mode: str,
        extra: list[str],
        tag: str = "",
        env: dict | None = None,
        home: Path | None = None,
    ) -> Run:
        """One start, timed; `home`: its store (default: a new, empty one)."""
        run_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-{tag}-", dir=self.work))
        serve_log = run_dir / "serve.log"  # its log beside its store
        fresh = home is None
        home = run_dir / "home" if home is None else home  # an empty store every time, unless given
        given = env or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
        env.update(PREBAKE_HOME=str(home), PREBAKE_RECIPES=str(self.recipes(variant)), PREBAKE_TRUSTED_KEYS="")
        env.update(PREBAKE_DOWNLOADS=str(downloads_dir()))  # the machine's: a wheel is downloaded once
        (self.models_home / "models").mkdir(parents=True, exist_ok=True)
        if fresh or not home.exists():
            home.mkdir()
            (home / "models").symlink_to(self.models_home / "models")  # weights made once (prepare_weights)
        env.update(given)
        log = serve_log.open("w+")
        cmd = [str(PREBAKE), "serve", "--model", self.model, "--precision", self.precision, "--port", "0", *extra]
        cmd += ["--tp", str(self.tp)] if self.tp > 1 else []
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            port = _wait_for_port(proc, serve_log)
            _wait_ready(proc, port, serve_log)
            ready = time.perf_counter() - started
            first, completion = _time_completion(port)
            if self.show and mode == "prebaked":
                print(f"  completion from the prebaked engine: {completion}", flush=True)
            if self.chat and mode == "prebaked":
                self.answers.append((self.chat, _chat(port, self.chat)))
            metrics = _get(port, "/metrics")[1]
            steps, parts = _startup_steps(metrics), _warm_up_parts(metrics)
            if mode in snapshot_mode.MODES:  # a restored process's metrics are its bake's start's
                steps, parts = {}, {}
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
            log.close()
        return Run(mode, variant, round(ready, 3), round(first, 4), steps, parts, _tokens(completion))


def summarise(runs: list[Run], variants) -> dict:
    def stats(values: list[float]) -> dict:
        return {
            "mean": statistics.fmean(values),
            "p50": statistics.median(values),
            "p90": _p90(values),
            "n": len(values),
        }

    eager = [r for r in runs if r.mode == "eager"]
    out: dict = {"eager": _mode_summary(eager, stats)}
    for mode in snapshot_mode.MODES:
        if restored := [r for r in runs if r.mode == mode]:
            out[mode] = _mode_summary(restored, stats)
    for variant in variants:
        cold_runs = [r for r in runs if r.mode == "cold" and r.variant == variant]
        prebaked = _mode_summary([r for r in runs if r.mode == "prebaked" and r.variant == variant], stats)
        if not cold_runs:  # --iterations 0 (warm starts only): no cold start, so no overhead removed
            out[variant] = {"prebaked": prebaked}
            continue
        cold = _mode_summary(cold_runs, stats)
        ratios = {
            stat: (cold["ready_s"][stat] - prebaked["ready_s"][stat])
            / (cold["ready_s"][stat] - out["eager"]["ready_s"][stat])
            for stat in ("mean", "p50")
        }
        out[variant] = {"cold": cold, "prebaked": prebaked, "compile_overhead_removed": ratios}
    return out


def _modes_of(summary: dict, variants) -> list[tuple[str, str]]:
    """(variant, mode) of every cold and prebaked summary the run has (no cold one at --iterations 0)."""
    return [(v, m) for v in variants for m in ("cold", "prebaked") if m in summary[v]]


def bake_summary(bench: Bench, variants) -> dict:
    """Each variant's bake compile step and graphs bundle bytes, and their ratios to dynamo-precompile's."""
    compile_s = {v: run.steps["compile"] for v in variants if (run := bench.bakes.get(v)) and "compile" in run.steps}
    sizes = {v: size for v in variants if (size := bench.graphs_bundle_bytes(v)) is not None}

    def over(values: dict) -> dict[str, float]:
        base = values.get("dynamo-precompile")
        return {v: round(x / base, 3) for v, x in values.items() if base and v != "dynamo-precompile"}

    return {
        **({"tp": bench.tp_bakes} if bench.tp_bakes else {}),
        "compile_s": {v: round(x, 3) for v, x in compile_s.items()},
        "compile_over_precompile": over(compile_s),
        "bundle_bytes": sizes,
        "bundle_over_precompile": over(sizes),
    }


def _mode_summary(runs: list[Run], stats) -> dict:
    step_names = sorted({name for r in runs for name in r.steps})
    part_names = sorted({name for r in runs for name in r.parts})
    return {
        "ready_s": stats([r.ready_s for r in runs]),
        "first_request_s": stats([r.first_request_s for r in runs]),
        "steps_mean_s": {name: statistics.fmean(r.steps.get(name, 0.0) for r in runs) for name in step_names},
        "parts_mean_s": {name: statistics.fmean(r.parts.get(name, 0.0) for r in runs) for name in part_names},
    }


def render(summary: dict, args, bakes: dict | None = None) -> str:
    lines = [
        f"\nstart-up of {args.model} {args.precision}, {args.iterations} iteration(s) per mode, "
        f"fresh subprocess and empty store each",
        "",
    ]
    header = f"{'mode':<24}{'ready mean':>12}{'p50':>9}{'p90':>9}{'1st req mean':>15}{'p50':>9}{'p90':>9}"
    lines += [header, "-" * len(header)]

    def row(name: str, m: dict) -> str:
        r, f = m["ready_s"], m["first_request_s"]
        return (
            f"{name:<24}{r['mean']:>11.2f}s{r['p50']:>8.2f}s{r['p90']:>8.2f}s"
            f"{f['mean'] * 1e3:>12.1f}ms{f['p50'] * 1e3:>7.1f}ms{f['p90'] * 1e3:>7.1f}ms"
        )

    lines.append(row("eager (floor)", summary["eager"]))
    for mode, name in zip(snapshot_mode.MODES, ("snapshot restore", "snapshot, stored"), strict=True):
        if mode in summary:
            lines.append(row(name, summary[mode]))
    cold_label = "cold*" if args.cold_from_bake else "cold "
    for variant in (v for v in VARIANTS if v in summary):
        if "cold" in summary[variant]:
            lines.append(row(f"{cold_label}    {variant}", summary[variant]["cold"]))
        lines.append(row(f"prebaked {variant}", summary[variant]["prebaked"]))
    if args.cold_from_bake:
        lines.append(
            "* the first cold start is the bake: a cold start with --write-back (it compiled every shape, "
            "then packed and published the bundles, a few seconds more than a cold start)"
        )
    lines.append("")
    bakes = bakes or {"compile_s": {}}
    for variant, seconds in bakes["compile_s"].items():
        ratio = bakes["compile_over_precompile"].get(variant)
        size = bakes["bundle_bytes"].get(variant)
        lines.append(
            f"bake of {variant:<17}: compile step {seconds:7.1f} s"
            + (f" ({ratio:.2f}x dynamo-precompile's)" if ratio else "")
            + (f", graphs bundle {size / 1e6:.2f} MB" if size else "")
            + (
                f" ({bakes['bundle_over_precompile'][variant]:.2f}x)"
                if variant in bakes["bundle_over_precompile"]
                else ""
            )
        )
    if "tp" in bakes:
        tp = max(int(k) for k in bakes["tp"])
        figures = tp_bakes.summary(bakes["tp"], tp)
        lines.append(
            f"bake at tp {tp} / tp 1: compile step {figures['compile_over_tp1']:.3f}x, graphs bundle "
            f"{figures['bundle_over_tp1']:.3f}x ({figures['by_tp']})"
        )
    for variant in (v for v in VARIANTS if v in summary and "compile_overhead_removed" in summary[v]):
        ratio = summary[variant]["compile_overhead_removed"]
        lines.append(
            f"compile overhead removed, {variant:<15} (cold - prebaked) / (cold - eager): "
            f"{ratio['mean']:.3f} on means, {ratio['p50']:.3f} on medians"
        )
    lines.append("\nmean seconds per start-up step:")
    modes = [("eager", summary["eager"])] + [
        (f"{m} {v}", summary[v][m]) for v, m in _modes_of(summary, [v for v in VARIANTS if v in summary])
    ]
    for name, m in modes:
        steps = ", ".join(f"{k} {s:.2f}" for k, s in m["steps_mean_s"].items())
        lines.append(f"  {name:<24} {steps}")
    lines.append("\nmean seconds per part of the warm-up step:")
    for name, m in modes:
        parts = ", ".join(f"{k} {s:.2f}" for k, s in m["parts_mean_s"].items())
        lines.append(f"  {name:<24} {parts}")
    for variant in (v for v in VARIANTS if v in summary):
        prebaked, eager = summary[variant]["prebaked"], summary["eager"]
        lines.append(
            f"\nprebaked {variant} / eager: {prebaked['ready_s']['mean'] / eager['ready_s']['mean']:.2f}x on means; "
            "what the prebaked start spends beyond the eager one, by step and part (s):"
        )
        lines.append("  " + ", ".join(f"{k} {v:+.2f}" for k, v in beyond_eager(prebaked, eager).items()))
    return "\n".join(lines)


def beyond_eager(prebaked: dict, eager: dict) -> dict[str, float]:
    """Mean seconds a prebaked start spends beyond the eager one, by step (and the warm-up by part)."""
    out: dict[str, float] = {}
    for step in sorted(set(prebaked["steps_mean_s"]) | set(eager["steps_mean_s"])):
        out[step] = prebaked["steps_mean_s"].get(step, 0.0) - eager["steps_mean_s"].get(step, 0.0)
    for part in sorted(set(prebaked["parts_mean_s"]) | set(eager["parts_mean_s"])):
        out[f"warm-up:{part}"] = prebaked["parts_mean_s"].get(part, 0.0) - eager["parts_mean_s"].get(part, 0.0)
    outside = prebaked["ready_s"]["mean"] - sum(prebaked["steps_mean_s"].values())
    out["outside steps"] = outside - (eager["ready_s"]["mean"] - sum(eager["steps_mean_s"].values()))
    return {k: round(v, 3) for k, v in out.items()}


def _recipe_path(model: str) -> Path:
    path = Path(model)
    if path.suffix == ".toml":
        return path
    folder = Path(os.environ.get("PREBAKE_RECIPES") or REPO / "recipes")
    return folder / f"{model}.toml"


def _variants(text: str) -> tuple[str, ...]:
    """--variant's value: a name of VARIANT_SETS, or variants joined by commas."""
    if text in VARIANT_SETS:
        return VARIANT_SETS[text]
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {', '.join(unknown) or repr(text)}; use {', '.join(VARIANTS)} (commas for several), "
            f"or {' or '.join(VARIANT_SETS)}"
        )
    return names


def default_variants(model: str) -> tuple[str, ...]:
    """What a plain run measures: the variant the recipe's starts use (its [compile] variant, else
    its engine's default), the one a user gets."""
    return (_recipe_variant(_recipe_path(model).read_text()),)


def _recipe_variant(toml: str) -> str:
    import tomllib

    from prebake.engine.adapters import adapter_named

    data = tomllib.loads(toml)
    return data.get("compile", {}).get(
        "variant", adapter_named(data["model"].get("engine", "prebake")).spec.default_variant
    )


def _with_one_sequence(toml: str, tokens: int) -> str:
    """The recipe text with its serving limits (every [serving] table) cut to one sequence of `tokens`."""
    for name, value in (("max_model_len", tokens), ("max_num_batched_tokens", tokens), ("max_num_seqs", 1)):
        toml = re.sub(rf"^{name}\s*=.*$", f"{name} = {value}", toml, flags=re.M)
    return toml


def _with_dtype(toml: str, dtype: str) -> str:
    """The recipe text with `dtype` in every `dtype = [...]` list ([matrix], [platforms.*]) that lacks it:
    --precision fp8 on a recipe that ships bf16 only (smollm2-135m, llama3.2-1b) measures its fp8 target
    without changing the shipped recipe (whose bf16 and fp32 keys stay as they are)."""

    def add(match: re.Match) -> str:
        names = re.findall(r'"([^"]+)"', match[1])
        return match[0] if dtype in names else f"dtype = {json.dumps([*names, dtype])}"  # a TOML array too

    return re.sub(r"^dtype\s*=\s*\[([^\]]*)\]", add, toml, flags=re.M)


def _with_variant(toml: str, variant: str) -> str:
    """The recipe text with [compile] variant set (the table is added when absent)."""
    line = f'variant = "{variant}"'
    if not re.search(r"^\[compile\]\s*$", toml, re.M):
        return toml.rstrip() + f"\n\n[compile]\n{line}\n"
    toml = re.sub(r"^variant\s*=.*\n", "", toml, flags=re.M)  # only [compile] has a `variant` key
    return re.sub(r"^\[compile\]\s*$", f"[compile]\n{line}", toml, count=1, flags=re.M)


def _wait_for_port(proc: subprocess.Popen, log: Path, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r"listening on http://[^:]+:(\d+)", log.read_text())
        if match:
            return int(match[1])
        _check_alive(proc, log)
        time.sleep(0.02)
    raise SystemExit(f"prebake serve did not listen within {timeout:.0f} s; its log is {log}")


def _wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _get(port, "/health")[0] == 200:
            return
        _check_alive(proc, log)
        time.sleep(0.05)
    raise SystemExit(f"prebake serve was not ready within {timeout:.0f} s; its log is {log}")


def _check_alive(proc: subprocess.Popen, log: Path) -> None:
    if proc.poll() is not None:
        raise SystemExit(f"prebake serve exited {proc.returncode}:\n{log.read_text()}")


def _time_completion(port: int, tokens: int = 16) -> tuple[float, str]:
    body = json.dumps({"prompt": PROMPT, "max_tokens": tokens, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        body = response.read().decode()
    return time.perf_counter() - started, body


def _chat(port: int, question: str, tokens: int = 32) -> str:
    """The answer to one chat question (greedy), as text."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": tokens, "temperature": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]["message"]["content"]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (
        urllib.error.URLError,
        ConnectionError,
        TimeoutError,
    ):  # too busy to answer yet; --tp N: rank 0 not listening yet
        return 0, ""


def _tokens(completion: str) -> list[int]:
    try:
        return list(json.loads(completion)["choices"][0]["token_ids"])
    except (ValueError, KeyError, IndexError):
        return []


def _startup_steps(metrics: str) -> dict[str, float]:
    return {
        m[1]: float(m[2]) for m in re.finditer(r'^prebake_startup_step_seconds\{step="([^"]+)"\} (\S+)$', metrics, re.M)
    }


def _warm_up_parts(metrics: str) -> dict[str, float]:
    return {
        m[1]: float(m[2]) for m in re.finditer(r'^prebake_startup_part_seconds\{part="([^"]+)"\} (\S+)$', metrics, re.M)
    }


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[8] if len(values) > 1 else values[0]


if __name__ == "__main__":
    main()
