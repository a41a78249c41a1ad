"""`prebake serve|fetch --engine vllm`: vLLM started from baked graphs by the shared starter
(prebake.engine.common.starter), which resolves, refuses misses and execs or watches it; this
module gives what differs: the private cache root (a writable copy of the installed vllm-cache/,
empty on a miss; on Gaudi also hpu-recipes/), vLLM's command line and variables (the recipe's
flags, the pins that keep a baked cache root valid here, what drifted since the bake), when it
serves, and what it compiled (captured from its cache root for write-back).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from prebake.artifacts.errors import RecipeError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fsutil import copy_writable
from prebake.artifacts.recipe.kinds import Builder, BuildRequest, TargetKeys
from prebake.artifacts.recipe.schema import parse_platform
from prebake.artifacts.store.local import Installed
from prebake.artifacts.store.stats import record_fallback
from prebake.engine.common import starter
from prebake.engine.common.adapter import (
    EngineAdapter,
    EngineOption,
    OpenServices,
    Services,
    StartRequest,
    options_from,
)
from prebake.engine.common.advice import bake_command
from prebake.engine.vllm import gaudi, ranks
from prebake.engine.vllm import portability as vllm_portability
from prebake.engine.vllm.fp8_host import refuse_emulated_fp8
from prebake.engine.vllm.process import (
    CACHE_DIR,
    REDIRECTS,
    REPORT_FILE,
    Running,
    aot_compile_on,
    baked_site,
    engine_flags,
    model_location,
    per_start_variables,
    read_report,
    recorded_variables,
    serving_variables,
    variable_drift,
    vllm_command,
    wait_ready,
)

# Flags the recipe decides; given again after `--` they change vLLM's cache key.
_RECIPE_FLAGS = (
    "--model",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--block-size",
    "--tensor-parallel-size",
    "-tp",
    "--dtype",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--quantization",
    "--compilation-config",
    "-O",
    "--enforce-eager",
)

Emit = Callable[[str], None]


@dataclass(frozen=True)
class VllmStart:
    """Everything needed to start vLLM: what the shared starter prepared, and vLLM's command."""

    shared: starter.Prepared
    launch: starter.Launch

    @property
    def plan(self) -> TargetKeys:
        return self.shared.plan

    @property
    def installed(self) -> dict[str, Installed]:
        return self.shared.installed

    @property
    def misses(self) -> tuple[Miss, ...]:
        return self.shared.misses

    @property
    def cache_root(self) -> Path:
        return self.shared.run_dir

    @property
    def variables(self) -> dict[str, str]:
        return self.shared.variables | self.launch.variables

    @property
    def argv(self) -> tuple[str, ...]:
        return self.launch.argv

    @property
    def cwd(self) -> Path | None:
        return self.launch.cwd

    @property
    def notes(self) -> tuple[str, ...]:
        return self.shared.notes + self.launch.notes

    def child_env(self, base: dict[str, str]) -> dict[str, str]:
        return starter.child_environment(self.launch, self.shared, base)


# The start options `prebake serve|fetch --engine vllm` take, declared once (the CLI builds its flags
# from them; the adapter's EngineSpec holds them): vLLM's own flags go after --.
OPTIONS = (
    EngineOption(
        "--cache-root",
        "a local folder for this vLLM's writable cache copy (default: a fresh one under $PREBAKE_HOME/engines/vllm)",
        type=Path,
        commands=("fetch", "serve"),
    ),
    EngineOption(
        "--force-aot-load",
        "strict loading (VLLM_FORCE_AOT_LOAD=1): vLLM exits when the baked AOT artifact does not load, instead "
        "of compiling again (targets where vLLM runs AOT compile: GPUs)",
        type=bool,
        default=False,
    ),
    EngineOption("--", "more `vllm serve` flags, after --", type=tuple, default=()),
)


@dataclass(frozen=True)
class _Options:
    """vLLM's start options, parsed (options_from: each declared once, in OPTIONS)."""

    cache_root: Path | None  # where this vLLM's writable cache copy goes
    engine_args: tuple[str, ...]  # `vllm serve` flags after --
    force_aot_load: bool  # strict loading (VLLM_FORCE_AOT_LOAD=1)

    @classmethod
    def of(cls, request: StartRequest) -> _Options:
        given = options_from(OPTIONS, request, "vllm")
        root = given["cache_root"]
        return cls(
            cache_root=Path(str(root)) if root is not None else None,
            engine_args=tuple(str(a) for a in cast(Sequence[object], given["engine_args"])),
            force_aot_load=bool(given["force_aot_load"]),
        )


def _cache_root(request: StartRequest) -> Path | None:
    """--cache-root, absolute (vLLM's working folder differs), or None: the starter's run folder."""
    given = _Options.of(request).cache_root
    return Path(os.path.abspath(given.expanduser())) if given else None


def prepare(request: StartRequest, context: Services) -> VllmStart:
    """Resolve the recipe's bundles on this host and lay out a private cache root for one vLLM
    (the shared starter), then vLLM's command line from them."""
    # the trees are held for the command's life (Context.holds): until vLLM is exec'd or has exited
    shared = starter.prepare(serve_environment, request, context, run_dir=_cache_root(request))
    started = launch(shared, request, context.store.home)
    return VllmStart(_without_incomplete_graphs(shared), started)


def launch(shared: starter.Prepared, request: StartRequest, home: Path) -> starter.Launch:
    """vLLM's command line from a prepared start: the recipe's flags, strict loading, the pins
    that keep a baked cache root valid on this host, and what differs from the bake."""
    plan, options, cache_root = shared.plan, _Options.of(request), shared.run_dir
    recipe, variables = plan.recipe, dict(shared.variables)
    refuse_emulated_fp8(plan)
    gap = rank_gap_miss(shared)
    if gap is not None and request.on_miss == "fail":
        raise starter.MissRefused(
            f"{gap.explain()}\n--on-miss is fail; rebake it: "
            f"{bake_command(recipe.model.name, plan.target.dtype, plan.target.tp)}, or use --on-miss compile"
        )
    added: dict[str, str] = ranks.thread_binding(plan.target, {**os.environ, **variables})
    if options.force_aot_load:
        if not aot_compile_on(recipe, plan.target):
            raise RecipeError(
                f"--force-aot-load: vLLM serves {plan.target.name} with its AOT compile off "
                f"(VLLM_USE_AOT_COMPILE=0: vLLM 0.32 on CPU cannot load its own AOT artifacts), so there is "
                f"no AOT artifact to load strictly; drop --force-aot-load, or use --on-miss fail to refuse a "
                f"start without the baked bundle"
            )
        added |= per_start_variables(plan.target, force_aot_load=True)
    graphs = None if gap is not None else shared.installed.get("graphs")
    portable = _portable(graphs, cache_root, variables | added)
    added |= portable.pins
    notes: tuple[str, ...] = (f"{gap.explain()}; vLLM compiles every rank",) if gap is not None else ()
    notes += portable.notes + _notes(options, graphs, variables | added, cache_root, plan)
    location = model_location(recipe, home / "models")
    argv = (
        *vllm_command(),
        "--model",
        location.name,
        *engine_flags(recipe, plan.target),
        *_listen_flags(request, options),
        *options.engine_args,
    )
    where = "the baked graphs" if graphs is not None else "an empty cache (vLLM compiles)"
    banner = f"starting vLLM for {plan.target.name} from {where}: VLLM_CACHE_ROOT={cache_root / CACHE_DIR}"
    return starter.Launch(argv, added, location.cwd, notes, unset=REDIRECTS, banner=banner)


def _portable(graphs: Installed | None, cache_root: Path, variables: dict[str, str]) -> vllm_portability.Portability:
    """The private cache root normalised for this host, and the factors that moved since the bake."""
    if graphs is None:
        return vllm_portability.Portability({}, ())
    env = {**os.environ, **variables}
    python = vllm_portability.interpreter(vllm_command(env))
    return vllm_portability.prepare_root(read_report(graphs.tree), cache_root / CACHE_DIR, env, python)


def _listen_flags(request: StartRequest, options: _Options) -> list[str]:
    flags = []
    if request.host is not None and "--host" not in options.engine_args:
        flags += ["--host", request.host]
    if request.port is not None and "--port" not in options.engine_args:
        flags += ["--port", str(request.port)]
    return flags


def _notes(
    options: _Options, graphs: Installed | None, variables: dict[str, str], root: Path, plan: TargetKeys
) -> tuple[str, ...]:
    notes = []
    overridden = sorted({a.split("=", 1)[0] for a in options.engine_args} & set(_RECIPE_FLAGS))
    if overridden:
        notes.append(
            f"vLLM flags {overridden} override the recipe's; vLLM keys its cache on them, so the baked "
            f"graphs may not be used: change the recipe instead"
        )
    if graphs is not None:
        baked = read_report(graphs.tree).get("variables", {})
        drift = variable_drift(baked, recorded_variables({**os.environ, **variables}))
        if drift:
            notes.append("variables differ from the bake, and vLLM keys its cache on them: " + "; ".join(drift))
    if gaudi.RECIPE_CACHE_ENV in variables:
        problem = gaudi.local_disk_problem(root)
        if problem:
            notes.append(problem)
    return tuple(notes)


def serve(adapter: EngineAdapter, request: StartRequest, open_services: OpenServices, emit: Emit) -> int:
    """Fetch, install, and run vLLM (the shared starter); vLLM's exit code (or 2/3/4 on a miss under
    --on-miss fail)."""
    return starter.serve(starter.Process(adapter, _Process(), emit, _cache_root(request)), request, open_services)


def serve_environment(plan: TargetKeys, installed: Mapping[str, Installed], run_dir: Path) -> dict[str, str]:
    """Variables that start vLLM from a private writable copy of the baked cache root under
    `run_dir` (empty on a miss: vLLM compiles into it); on Gaudi, of the HPU recipe cache too."""
    graphs = installed.get("graphs")
    if graphs is not None and _rank_gaps(graphs, plan.target.tp):
        graphs = None  # a bundle without every rank's cache: vLLM compiles into an empty root (rank_gap_miss)
    variables = serving_variables(plan.recipe, plan.target, _private(graphs, CACHE_DIR, run_dir))
    if parse_platform(plan.target.platform)[0] == "gaudi":
        recipes = _private(graphs, gaudi.RECIPES_DIR, run_dir)
        buckets = installed["buckets"].tree if "buckets" in installed else None
        variables |= gaudi.hpu_variables(plan.recipe, recipes, buckets)
    return variables


def _private(graphs: Installed | None, name: str, run_dir: Path) -> Path:
    if graphs is not None and (graphs.tree / name).is_dir():
        return copy_writable(graphs.tree / name, run_dir / name)
    (run_dir / name).mkdir(parents=True, exist_ok=True)
    return run_dir / name


def _rank_gaps(graphs: Installed, tp: int) -> tuple[ranks.RankGap, ...]:
    return ranks.gaps(graphs.tree / CACHE_DIR, tp, read_report(graphs.tree).get("ranks"))


def rank_gap_miss(shared: starter.Prepared) -> Miss | None:
    """The installed graphs bundle as a miss when it lacks a rank's compile cache (ranks.gaps),
    naming the rank; None when it holds every rank's, or when there is none."""
    graphs = shared.installed.get("graphs")
    if graphs is None:
        return None
    found = _rank_gaps(graphs, shared.plan.target.tp)
    if not found:
        return None
    return Miss(shared.plan.key("graphs"), ranks.describe_gaps(found), refused=True)


def _without_incomplete_graphs(shared: starter.Prepared) -> starter.Prepared:
    """`shared` with a graphs bundle that lacks a rank moved from the installed to the misses."""
    miss = rank_gap_miss(shared)
    if miss is None:
        return shared
    installed = {k: v for k, v in shared.installed.items() if k != "graphs"}
    return dataclasses.replace(shared, installed=installed, misses=(*shared.misses, miss))


class _Process:
    """What the shared starter asks of vLLM as its own process (prebake.engine.common.starter.EngineProcess)."""

    def launch(self, prepared: starter.Prepared, request: StartRequest, services: Services) -> starter.Launch:
        started = launch(prepared, request, services.store.home)
        if rank_gap_miss(prepared) is not None:
            record_fallback(services.store, "graphs")  # vLLM compiles what the bundle lacks
        return started

    def ready(self, proc: subprocess.Popen, log: Path, started: float, launch: starter.Launch) -> float:
        host = _flag_value(launch.argv, "--host", "127.0.0.1")
        port = _flag_value(launch.argv, "--port", "8000")
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        return wait_ready(Running(proc, log, started), url)

    def capture(self, prepared: starter.Prepared, launch: starter.Launch, ready_s: float) -> Builder:
        """Graphs from a snapshot of the running vLLM's cache root (and, on Gaudi, its HPU recipes)."""
        root, variables = prepared.run_dir, prepared.variables | launch.variables

        def capture(request: BuildRequest) -> None:
            shutil.copytree(root / CACHE_DIR, request.out / CACHE_DIR, symlinks=True)
            if (root / gaudi.RECIPES_DIR).is_dir():
                shutil.copytree(root / gaudi.RECIPES_DIR, request.out / gaudi.RECIPES_DIR, symlinks=True)
            document = {
                "flags": list(launch.argv[len(vllm_command()) :]),
                "ready_s": round(ready_s, 3),
                "variables": recorded_variables(variables | dict(os.environ)),
                "written_back": True,
                "ranks": ranks.rank_keys(_read(root / "vllm.log")),  # the starter's log of the watched vLLM
                "site": baked_site(dict(os.environ) | variables, root / CACHE_DIR),
            }
            (request.out / REPORT_FILE).write_text(json.dumps(document, indent=1, sort_keys=True))

        return capture


def write_back(prepared: VllmStart, context: Services, ready_s: float, *, timeout: float = 600.0) -> list[str]:
    """Publish every kind that missed, within `timeout` seconds in all (the shared starter's write-back)."""
    return starter.write_back(_Process(), "graphs", prepared.shared, prepared.launch, context, ready_s, timeout=timeout)


def _read(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except OSError:
        return ""


def _flag_value(argv: Sequence[str], flag: str, default: str) -> str:
    value = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
