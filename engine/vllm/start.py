"""`prebake serve --engine vllm` and `prebake fetch --engine vllm`: vLLM started from baked graphs.

    probe host -> keys -> fetch + verify + install (buckets, autotune, graphs)
      -> a private cache root: a writable copy of the installed vllm-cache/ (empty on a miss,
         and vLLM compiles into it), on Gaudi also of hpu-recipes/
      -> vLLM with VLLM_CACHE_ROOT there (+ on Gaudi the bucket and recipe-cache variables)
      -> with --write-back and a graphs miss: once vLLM is ready, pack and publish its cache root
         (to the registry's quarantine namespace unless PREBAKE_WRITE_BACK=index: registry.writeback)

Without --write-back prebake execs vLLM: vLLM gets the signals and the exit code is its own.
A registry fault is a miss (vLLM compiles), unless --on-miss fail.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from prebake.artifacts.bake.fetch import Miss, miss_advice, miss_exit_code
from prebake.artifacts.bake.kinds import Builder, BuildRequest, TargetKeys
from prebake.artifacts.errors import RecipeError
from prebake.artifacts.store.local import Installed
from prebake.artifacts.store.stats import record_fallback
from prebake.engine.common import write_back as publishing
from prebake.engine.common.adapter import EngineStartError, Services, StartRequest, plan_to_start
from prebake.engine.common.mounted import resolve_with_mounts
from prebake.engine.vllm import gaudi
from prebake.engine.vllm import portability as vllm_portability
from prebake.engine.vllm.process import (
    CACHE_DIR,
    REDIRECTS,
    REPORT_FILE,
    Launch,
    aot_compile_on,
    baked_site,
    engine_flags,
    model_location,
    per_start_variables,
    read_report,
    recorded_variables,
    start,
    stop,
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
class Prepared:
    """Everything needed to start vLLM: the plan, what was installed, and the command."""

    plan: TargetKeys
    installed: dict[str, Installed]
    misses: tuple[Miss, ...]
    cache_root: Path
    variables: dict[str, str]
    argv: tuple[str, ...]
    cwd: Path | None
    notes: tuple[str, ...]

    def child_env(self, base: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in base.items() if k not in REDIRECTS} | self.variables


@dataclass(frozen=True)
class _Options:
    """vLLM's start options (StartRequest.options, checked by the adapter against OPTIONS)."""

    cache_root: Path | None = None  # where this vLLM's writable cache copy goes
    engine_args: tuple[str, ...] = ()  # `vllm serve` flags after --
    force_aot_load: bool = False  # strict loading (VLLM_FORCE_AOT_LOAD=1)

    @classmethod
    def of(cls, request: StartRequest) -> _Options:
        given = request.options
        root = given.get("cache_root")
        return cls(
            cache_root=Path(str(root)) if root is not None else None,
            engine_args=tuple(str(a) for a in cast(Sequence[object], given.get("engine_args", ()))),
            force_aot_load=bool(given.get("force_aot_load", False)),
        )


def prepare(request: StartRequest, context: Services) -> Prepared:
    """Resolve the recipe's bundles on this host and lay out a private cache root for one vLLM."""
    plan = plan_to_start(request, context)
    recipe, adapter, options = plan.recipe, context.adapter(plan), _Options.of(request)
    # the trees are held for the command's life (Context.holds): until vLLM is exec'd or has exited
    resolution = resolve_with_mounts(plan, request, context)
    home = context.store.home
    given = Path(os.path.abspath(options.cache_root.expanduser())) if options.cache_root else None  # vLLM's cwd differs
    cache_root = given or home / "engines" / "vllm" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    variables = adapter.serve_environment(plan, resolution.installed, cache_root)
    if options.force_aot_load:
        if not aot_compile_on(recipe, plan.target):
            raise RecipeError(
                f"--force-aot-load: vLLM serves {plan.target.name} with its AOT compile off "
                f"(VLLM_USE_AOT_COMPILE=0: vLLM 0.32 on CPU cannot load its own AOT artifacts), so there is "
                f"no AOT artifact to load strictly; drop --force-aot-load, or use --on-miss fail to refuse a "
                f"start without the baked bundle"
            )
        variables |= per_start_variables(plan.target, force_aot_load=True)
    portable = _portable(resolution.installed.get("graphs"), cache_root, variables)
    variables |= portable.pins
    notes = (
        resolution.notes
        + portable.notes
        + _notes(options, resolution.installed.get("graphs"), variables, cache_root, plan)
    )
    location = model_location(recipe, home / "models")
    argv = (
        *vllm_command(),
        "--model",
        location.name,
        *engine_flags(recipe, plan.target),
        *_listen_flags(request, options),
        *options.engine_args,
    )
    return Prepared(plan, resolution.installed, resolution.misses, cache_root, variables, argv, location.cwd, notes)


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


def serve(request: StartRequest, context: Services, emit: Emit) -> int:
    """Fetch, install, and run vLLM; returns vLLM's exit code (or 2/3/4 on a miss under --on-miss fail)."""
    prepared = prepare(request, context)
    for line in [m.explain() for m in prepared.misses] + list(prepared.notes):
        emit(f"prebake: {line}")
    if prepared.misses and request.on_miss == "fail":
        emit(
            f"prebake: no complete bundle set for {prepared.plan.target.name} in {context.address}; not starting "
            f"(--on-miss fail); "
            + miss_advice(
                prepared.misses,
                target=prepared.plan.target.name,
                bake=f"doit bake model={prepared.plan.target.recipe} precision={prepared.plan.target.dtype}",
                address=context.address,
            )
        )
        return miss_exit_code(prepared.misses)
    where = "the baked graphs" if "graphs" in prepared.installed else "an empty cache (vLLM compiles)"
    emit(
        f"prebake: starting vLLM for {prepared.plan.target.name} from {where}: VLLM_CACHE_ROOT={prepared.cache_root / CACHE_DIR}"
    )
    env = prepared.child_env(dict(os.environ))
    if "graphs" not in prepared.installed:
        record_fallback(context.store, "graphs")  # vLLM compiles them as it starts
    if not (request.write_back and "graphs" not in prepared.installed):
        if prepared.cwd is not None:
            os.chdir(prepared.cwd)
        os.execvpe(prepared.argv[0], list(prepared.argv), env)
    return _serve_and_write_back(prepared, env, context, emit, timeout=request.fetch_timeout)


def _serve_and_write_back(
    prepared: Prepared, env: dict[str, str], context: Services, emit: Emit, *, timeout: float
) -> int:
    log = prepared.cache_root / "vllm.log"
    running = start(Launch(prepared.argv, env, prepared.cwd, log))
    emit(f"prebake: vLLM's log: {log}")

    def forward(signum, _frame) -> None:
        running.proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        host = _flag_value(prepared.argv, "--host", "127.0.0.1")
        port = _flag_value(prepared.argv, "--port", "8000")
        seconds = wait_ready(running, f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}")
        emit(f"prebake: vLLM ready in {seconds:.1f} s; writing its cache back")
        for line in write_back(prepared, context, seconds, timeout=timeout):  # failures are lines, never raised
            emit(f"prebake: {line}")
        return running.proc.wait()
    except EngineStartError as exc:
        emit(f"prebake: {exc}")
        stop(running)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def write_back(prepared: Prepared, context: Services, ready_s: float, *, timeout: float = 600.0) -> list[str]:
    """Publish every kind that missed, within `timeout` seconds in all (the one write-back policy,
    prebake.engine.common.write_back); graphs from a snapshot of the running vLLM's cache root."""

    def capture(request: BuildRequest) -> None:
        shutil.copytree(prepared.cache_root / CACHE_DIR, request.out / CACHE_DIR, symlinks=True)
        if (prepared.cache_root / gaudi.RECIPES_DIR).is_dir():
            shutil.copytree(prepared.cache_root / gaudi.RECIPES_DIR, request.out / gaudi.RECIPES_DIR, symlinks=True)
        document = {
            "flags": list(prepared.argv[len(vllm_command()) :]),
            "ready_s": round(ready_s, 3),
            "variables": recorded_variables(prepared.variables | dict(os.environ)),
            "written_back": True,
            "site": baked_site(dict(os.environ) | prepared.variables, prepared.cache_root / CACHE_DIR),
        }
        (request.out / REPORT_FILE).write_text(json.dumps(document, indent=1, sort_keys=True))

    compiled = context.adapter(prepared.plan).fallback_kind
    builds: dict[str, Builder | None] = {
        kind: capture if kind == compiled else None
        for kind in prepared.plan.kinds.names
        if kind not in prepared.installed
    }
    results = publishing.write_back(prepared.plan, builds, context, installed=prepared.installed, timeout=timeout)
    return [f"{r.kind}: {r.note}, key {r.key[:16]}" for r in results]


def fetch_environment(request: StartRequest, context: Services) -> Prepared:
    """`prebake fetch --engine vllm`: install and lay out the cache root; the caller prints it."""
    return prepare(request, context)


def _flag_value(argv: Sequence[str], flag: str, default: str) -> str:
    value = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
