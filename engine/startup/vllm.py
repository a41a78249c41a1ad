"""`prebake serve --engine vllm` and `prebake fetch --engine vllm`: vLLM started from baked graphs.

    probe host -> keys -> fetch + verify + install (buckets, autotune, graphs)
      -> a private cache root: a writable copy of the installed vllm-cache/ (empty on a miss,
         and vLLM compiles into it), on Gaudi also of hpu-recipes/
      -> vLLM with VLLM_CACHE_ROOT there (+ on Gaudi the bucket and recipe-cache variables)
      -> with --write-back and a graphs miss: once vLLM is ready, pack and publish its cache root

Without --write-back prebake execs vLLM: vLLM gets the signals and the exit code is its own.
A registry fault is a miss (vLLM compiles), unless --on-miss fail.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from artifacts.bake import bake_kind
from artifacts.errors import PrebakeError, RecipeError
from artifacts.fetch import Miss
from artifacts.kinds import KINDS, Plan
from artifacts.recipes import load_recipe
from artifacts.store import Installed, Store
from engine.adapters import EngineStartError, gaudi, vllm_portability
from engine.adapters.vllm import (
    CACHE_DIR,
    REDIRECTS,
    REPORT_FILE,
    Launch,
    baked_site,
    engine_flags,
    model_location,
    read_report,
    recorded_variables,
    start,
    stop,
    variable_drift,
    vllm_command,
    wait_ready,
)

EXIT_MISS = 3
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
    """What `prebake serve|fetch --engine vllm` was asked for."""

    model: str
    precision: str | None = None
    tp: int | None = None
    registry: str | None = None
    cache_root: Path | None = None
    host: str | None = None
    port: int | None = None
    on_miss: str = "compile"
    write_back: bool = False
    vllm_args: tuple[str, ...] = ()
    time_box_s: float = 605.0  # lookup and download together; then vLLM starts without the bundles


@dataclass(frozen=True)
class Prepared:
    """Everything needed to start vLLM: the plan, what was installed, and the command."""

    plan: Plan
    installed: dict[str, Installed]
    misses: tuple[Miss, ...]
    cache_root: Path
    variables: dict[str, str]
    argv: tuple[str, ...]
    cwd: Path | None
    notes: tuple[str, ...]

    def child_env(self, base: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in base.items() if k not in REDIRECTS} | self.variables


def prepare(request: VllmStart, *, store: Store, registry, host, trust=None) -> Prepared:
    """Resolve the recipe's bundles on this host and lay out a private cache root for one vLLM."""
    from engine.startup.install import vllm_environment
    from engine.startup.pipeline import pick_plan

    recipe = load_recipe(request.model)
    if recipe.model.engine != "vllm":
        raise RecipeError(
            f"recipe {recipe.model.name} is served by engine {recipe.model.engine!r}; --engine vllm "
            f"needs a recipe with engine = 'vllm', such as tiny-llama-vllm"
        )
    plan = pick_plan(recipe, host, dtype=request.precision, tp=request.tp)
    resolution = _resolve_time_boxed(plan, store, registry, trust, request.time_box_s)
    cache_root = (
        request.cache_root or store.home / "engines" / "vllm" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    )
    variables = vllm_environment(plan, resolution.installed.get("graphs"), cache_root)
    portable = _portable(resolution.installed.get("graphs"), cache_root, variables)
    variables |= portable.pins
    location = model_location(recipe, store.home / "models")
    argv = (
        *vllm_command(),
        "--model",
        location.name,
        *engine_flags(recipe, plan.target),
        *_listen_flags(request),
        *request.vllm_args,
    )
    notes = portable.notes + _notes(request, resolution.installed.get("graphs"), variables, cache_root, plan)
    return Prepared(plan, resolution.installed, resolution.misses, cache_root, variables, argv, location.cwd, notes)


def _resolve_time_boxed(plan: Plan, store: Store, registry, trust, seconds: float):
    """resolve(), but a registry fault or a registry slower than `seconds` is a miss: vLLM compiles."""
    from engine.startup.pipeline import Resolution, resolve

    outcome: dict = {}

    def work() -> None:
        try:
            outcome["resolution"] = resolve(plan, store=store, registry=registry, trust=trust)
        except (PrebakeError, OSError) as exc:
            outcome["error"] = f"the registry failed: {exc}"

    worker = threading.Thread(target=work, name="prebake-resolve", daemon=True)
    worker.start()
    worker.join(seconds)
    if "resolution" in outcome:
        return outcome["resolution"]
    reason = outcome.get("error", f"the registry did not answer within {seconds:g} s; starting without it")
    return Resolution(plan, {}, tuple(Miss(plan.key(kind), reason) for kind in KINDS))


def _portable(graphs: Installed | None, cache_root: Path, variables: dict[str, str]) -> vllm_portability.Portability:
    """The private cache root normalised for this host, and the factors that moved since the bake."""
    if graphs is None:
        return vllm_portability.Portability({}, ())
    env = {**os.environ, **variables}
    python = vllm_portability.interpreter(vllm_command(env))
    return vllm_portability.prepare_root(read_report(graphs.tree), cache_root / CACHE_DIR, env, python)


def _listen_flags(request: VllmStart) -> list[str]:
    flags = []
    if request.host is not None and "--host" not in request.vllm_args:
        flags += ["--host", request.host]
    if request.port is not None and "--port" not in request.vllm_args:
        flags += ["--port", str(request.port)]
    return flags


def _notes(
    request: VllmStart, graphs: Installed | None, variables: dict[str, str], root: Path, plan: Plan
) -> tuple[str, ...]:
    notes = []
    overridden = sorted({a.split("=", 1)[0] for a in request.vllm_args} & set(_RECIPE_FLAGS))
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


def serve(request: VllmStart, emit: Emit) -> int:
    """Fetch, install, and run vLLM; returns vLLM's exit code (or 3 on a refused miss)."""
    from engine.probe import current_host
    from registry import open_registry
    from registry.signing import trust_from_env

    store = Store()
    registry = open_registry(store.registry_address(request.registry))
    prepared = prepare(request, store=store, registry=registry, host=current_host(), trust=trust_from_env())
    for line in [m.explain() for m in prepared.misses] + list(prepared.notes):
        emit(f"prebake: {line}")
    if prepared.misses and request.on_miss == "fail":
        emit(
            f"prebake: no complete bundle set for {prepared.plan.target.name} in {registry.url}; not starting (--on-miss fail)"
        )
        return EXIT_MISS
    where = "the baked graphs" if "graphs" in prepared.installed else "an empty cache (vLLM compiles)"
    emit(
        f"prebake: starting vLLM for {prepared.plan.target.name} from {where}: VLLM_CACHE_ROOT={prepared.cache_root / CACHE_DIR}"
    )
    env = prepared.child_env(dict(os.environ))
    if not (request.write_back and "graphs" not in prepared.installed):
        if prepared.cwd is not None:
            os.chdir(prepared.cwd)
        os.execvpe(prepared.argv[0], list(prepared.argv), env)
    return _serve_and_write_back(prepared, env, store, registry, request, emit)


def _serve_and_write_back(
    prepared: Prepared, env: dict[str, str], store: Store, registry, request: VllmStart, emit: Emit
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
        try:
            for line in write_back(prepared, store, registry, seconds):
                emit(f"prebake: {line}")
        except PrebakeError as exc:  # publishing never swallows an error, but it must not stop a serving engine
            emit(f"prebake: write-back failed: {exc}")
        return running.proc.wait()
    except EngineStartError as exc:
        emit(f"prebake: {exc}")
        stop(running)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def write_back(prepared: Prepared, store: Store, registry, ready_s: float) -> list[str]:
    """Publish every kind that missed; graphs from a snapshot of the running vLLM's cache root."""
    from engine.builders import build
    from registry.signing import signer_from_env, trust_from_env

    def capture(request) -> None:
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

    lines = []
    for kind in KINDS:
        if kind in prepared.installed:
            continue
        baked = bake_kind(
            prepared.plan,
            kind,
            store=store,
            registry=registry,
            build=capture if kind == "graphs" else build,
            sign=signer_from_env(),
            trust=trust_from_env(),
        )
        lines.append(f"{kind}: {baked.note}, key {baked.manifest.key_digest[:16]}")
    return lines


def fetch_environment(request: VllmStart) -> Prepared:
    """`prebake fetch --engine vllm`: install and lay out the cache root; the caller prints it."""
    from engine.probe import current_host
    from registry import open_registry
    from registry.signing import trust_from_env

    store = Store()
    registry = open_registry(store.registry_address(request.registry))
    return prepare(request, store=store, registry=registry, host=current_host(), trust=trust_from_env())


def _flag_value(argv: Sequence[str], flag: str, default: str) -> str:
    value = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
