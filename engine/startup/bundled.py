"""The engine's start-up: from a recipe name to warm compiled steps, one logged step at a time.

    probe       this host's platform and software                    engine.probe
    keys        the recipe's target here and its artifact keys        artifacts.kinds
    lookup      each key in the store, else the registry (time box)   registry
    verify      registry entries carry the wanted key; trust policy   registry.signing
    fetch       download, check digests, unpack into the store        artifacts.store
    build       buckets/autotune that missed, built in place          engine.builders
    install     a private writable copy of the graphs tree; Inductor pointed at it
    load        weights and the static KV cache                       engine.runtime.loader
    warm-up     every step shape once, from the bundle                (graphs hit)
    compile     every step shape compiled in place, as `doit bake`    (graphs miss)
    write-back  what was built in place packed and published          (--write-back)

Every step logs one line with its duration and sets prebake_startup_step_seconds. A miss,
a registry fault, a time-out or a failed verification is a Miss with its reason: logged,
counted, and compiled in place, unless --on-miss fail, which raises MissRefused. The store's
trees are only read: the engine compiles and loads from its private copy under
$PREBAKE_HOME/tmp/serve-<pid>-<n>/, removed by Engine.close().
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from artifacts.bake import UPSTREAM, BuildRequest, bake_kind
from artifacts.buckets import BucketSet
from artifacts.errors import PrebakeError, StoreError
from artifacts.fetch import Miss, nearest_miss
from artifacts.kinds import KINDS, Plan
from artifacts.manifest import Manifest
from artifacts.recipes import Recipe, load_recipe
from artifacts.store import Installed, Store
from engine import builders
from engine.probe import current_host
from engine.runtime.metrics import Metrics
from engine.runtime.shapes import StepShape, step_shapes
from engine.startup import install
from engine.startup.pipeline import pick_plan

if TYPE_CHECKING:  # torch is imported once the environment is set (install step), not before
    from engine.runtime.steps import CompiledSteps, Tactic

Emit = Callable[[str], None]
_runs = itertools.count()


class StartupSettings(BaseModel):
    """What `prebake serve` was asked to start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    precision: str | None = None
    tp: int | None = Field(default=None, gt=0)
    registry: str | None = None
    registry_timeout: float = Field(default=5.0, gt=0, description="seconds the registry lookup may take")
    fetch_timeout: float = Field(default=600.0, gt=0, description="seconds downloads (and write-back) may take")
    on_miss: Literal["compile", "fail"] = "compile"
    write_back: bool = False
    eager: bool = Field(default=False, description="compilation off: the eager floor")


class MissRefused(PrebakeError, LookupError):
    """Bundles missed and the engine was told --on-miss fail."""


@dataclass
class Engine:
    """A started engine: warm steps over the recipe's buckets, and the folder it runs in."""

    plan: Plan
    steps: CompiledSteps
    buckets: BucketSet
    tactics: dict[StepShape, Tactic]
    run_dir: Path
    store: Store  # owns run_dir (a store scratch folder) for as long as the engine lives
    built: tuple[str, ...] = ()  # kinds compiled in place
    leases: ExitStack = field(default_factory=ExitStack)  # holds the store trees it was started from

    @property
    def recipe(self) -> Recipe:
        return self.plan.recipe

    def close(self) -> None:
        self.leases.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


@dataclass
class _Step:
    detail: str = ""


@dataclass
class StepLog:
    """One line per step with its duration, mirrored into the metrics."""

    metrics: Metrics
    emit: Emit
    progress: Callable[[str], None] | None = None  # told each step's name as it begins
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str):
        if self.progress is not None:
            self.progress(name)
        record = _Step()
        started = time.perf_counter()
        yield record
        took = time.perf_counter() - started
        self.seconds[name] = took
        self.metrics.set("prebake_startup_step_seconds", round(took, 6), step=name)
        self.emit(f"prebake serve: {name}: {record.detail} ({took:.2f} s)")

    def note(self, text: str) -> None:
        for line in text.splitlines():
            self.emit(f"prebake serve:   {line}")


def start(
    settings: StartupSettings, metrics: Metrics, emit: Emit, progress: Callable[[str], None] | None = None
) -> Engine:
    """Run the start-up pipeline; the warm engine. Raises MissRefused under --on-miss fail."""
    log = StepLog(metrics, emit, progress)
    store = Store()
    with log.step("probe") as s:
        host = current_host()
        s.detail = host.platform.describe()
    with log.step("keys") as s:
        plan = pick_plan(load_recipe(settings.model), host, dtype=settings.precision, tp=settings.tp)
        kinds = ("buckets", "autotune") if settings.eager else KINDS
        s.detail = f"{plan.target.name} " + ", ".join(f"{k} {plan.key(k).digest[:12]}" for k in kinds)
    run_dir = store.scratch(f"serve-{os.getpid()}-{next(_runs)}")
    leases = ExitStack()
    try:
        engine = _start(settings, plan, kinds, store, run_dir, log, leases)
    except BaseException:
        leases.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    engine.leases = leases
    return engine


def _start(
    settings: StartupSettings,
    plan: Plan,
    kinds: tuple[str, ...],
    store: Store,
    run_dir: Path,
    log: StepLog,
    leases: ExitStack,
) -> Engine:
    from registry.signing import trust_from_env

    trust = trust_from_env()
    address = store.registry_address(settings.registry)
    with log.step("lookup") as s:
        registry, found, answered = _lookup(plan, kinds, store, address, trust, settings.registry_timeout)
        s.detail = _summary(found, address)
    with log.step("verify") as s:
        found = {k: _verify(plan.key(k), v, trust) if isinstance(v, Manifest) else v for k, v in found.items()}
        s.detail = f"{sum(isinstance(v, Manifest) for v in found.values())} registry bundle(s) carry their keys and pass the trust policy"
    with log.step("fetch") as s:
        installed = _fetch(found, store, registry, settings.fetch_timeout)
        s.detail = ", ".join(
            f"{k} {i.manifest.blob.hex[:12]}" for k, i in installed.items() if isinstance(i, Installed)
        )
        s.detail = s.detail or "nothing to fetch"
    installed = _hold(installed, store, leases)
    misses = [v for v in installed.values() if isinstance(v, Miss)]
    installed = {k: v for k, v in installed.items() if isinstance(v, Installed)}
    _count(log.metrics, installed, misses, found)
    for miss in misses:
        log.note(miss.explain())
    if misses and settings.on_miss == "fail":
        raise MissRefused(
            f"{len(misses)} of {plan.target.name}'s bundles missed (above) and --on-miss is fail; "
            f"bake them (doit bake model={plan.target.recipe} precision={plan.target.dtype}) or use --on-miss compile"
        )
    trees = {k: i.tree for k, i in installed.items()}
    built = [m.key.kind for m in misses]
    if missing := [k for k in ("buckets", "autotune") if k not in trees]:
        with log.step("build") as s:
            for kind in missing:
                trees[kind] = _build_in_place(plan, kind, trees, run_dir)
                log.metrics.add("prebake_fallback_compiles_total", kind=kind)
            s.detail = f"built {', '.join(missing)} in place with the bake's builders"
    engine = _warm(settings, plan, trees, installed.get("graphs"), store, run_dir, log, built)
    if settings.write_back and built:
        with log.step("write-back") as s:
            if registry is None or not answered:
                s.detail = f"skipped: registry {address} did not answer at start-up; the next start compiles again"
            else:
                s.detail = _write_back(plan, built, trees, store, registry, trust, settings.fetch_timeout, log)
    return engine


def _lookup(plan: Plan, kinds, store: Store, address: str, trust, timeout: float):
    """Each kind: Installed (store hit), Manifest (registry entry, unverified) or Miss; the registry
    (None if it could not be opened in time); whether the registry answered within the time box."""
    from registry import open_registry
    from registry.errors import RegistryError, UnknownRegistryError

    found: dict[str, Installed | Manifest | Miss] = {}
    box: dict = {}

    def run() -> None:
        try:
            box["registry"] = registry = open_registry(address)
        except UnknownRegistryError as exc:
            box["error"] = exc
            return
        except RegistryError as exc:
            for kind in kinds:
                found[kind] = Miss(plan.key(kind), f"registry {address} cannot be opened: {exc}")
            return
        fault = None  # a registry that is down for one key is down for the next: do not wait on it again
        for kind in kinds:
            key = plan.key(kind)
            if (hit := _from_store(key, store, trust)) is not None:
                found[kind] = hit
            elif fault is not None:
                found[kind] = Miss(key, fault)
            else:
                try:
                    found[kind] = registry.lookup(kind, key.digest) or nearest_miss(
                        registry, key, f"no bundle for this key in {registry.url}"
                    )
                except Exception as exc:  # any fault (down, refused, corrupt entry) is a miss, never a crash
                    fault = f"registry {registry.url} failed: {type(exc).__name__}: {exc}"
                    found[kind] = Miss(key, fault)

    worker = threading.Thread(target=run, name="prebake-lookup", daemon=True)
    worker.start()
    worker.join(timeout)
    if "error" in box:
        raise box["error"]
    for kind in kinds:  # dict reads are atomic: what the worker finished in time counts, the rest timed out
        found.setdefault(
            kind,
            Miss(
                plan.key(kind),
                f"registry {address} did not answer within {timeout:g} s (--registry-timeout); serving without it",
            ),
        )
    return box.get("registry"), {k: found[k] for k in kinds}, not worker.is_alive()


def _from_store(key, store: Store, trust) -> Installed | None:
    installed = store.lookup(key.kind, key.digest)
    if installed is not None and (trust is None or trust(installed.manifest) is None):
        return installed
    return None


def _verify(key, manifest: Manifest, trust) -> Manifest | Miss:
    if manifest.key_digest != key.digest or manifest.the_key() != key:
        return Miss(key, f"the registry's entry for {key.digest[:16]} carries another key; it was tampered with")
    refused = None if trust is None else trust(manifest)
    return manifest if refused is None else Miss(key, f"refused by the trust policy: {refused}")


def _fetch(found: dict, store: Store, registry, timeout: float) -> dict[str, Installed | Miss]:
    out: dict[str, Installed | Miss] = {k: v for k, v in found.items() if not isinstance(v, Manifest)}

    def run() -> None:
        for kind, value in found.items():
            if not isinstance(value, Manifest):
                continue
            try:
                out[kind] = store.install(value, registry)
            except Exception as exc:  # a bad blob or a dropped download is a miss: compile instead
                out[kind] = Miss(value.the_key(), f"fetching blob {value.blob.digest[:23]} failed: {exc}")

    worker = threading.Thread(target=run, name="prebake-fetch", daemon=True)
    worker.start()
    worker.join(timeout)
    for kind, value in found.items():
        if kind not in out:
            out[kind] = Miss(value.the_key(), f"fetching blob {value.blob.digest[:23]} took longer than {timeout:g} s")
    return {k: out[k] for k in found}


def _hold(got: dict[str, Installed | Miss], store: Store, leases: ExitStack) -> dict[str, Installed | Miss]:
    """Lease every installed tree for the engine's life, so `prebake gc` never evicts one under it."""
    held: dict[str, Installed | Miss] = {}
    for kind, value in got.items():
        if isinstance(value, Installed):
            try:
                value = leases.enter_context(store.use(value))
            except StoreError as exc:  # evicted between fetch and hold: compile in place instead
                value = Miss(value.manifest.the_key(), str(exc))
        held[kind] = value
    return held


def _count(metrics: Metrics, installed: dict[str, Installed], misses: list[Miss], found: dict) -> None:
    for kind in installed:
        metrics.add(
            "prebake_bundle_hits_total", kind=kind, source="store" if isinstance(found[kind], Installed) else "registry"
        )
    for miss in misses:
        metrics.add("prebake_bundle_misses_total", kind=miss.key.kind)


def _summary(found: dict, address: str) -> str:
    parts = []
    for kind, value in found.items():
        parts.append(
            f"{kind} "
            + (
                "in the store"
                if isinstance(value, Installed)
                else "in the registry"
                if isinstance(value, Manifest)
                else "missed"
            )
        )
    return f"{', '.join(parts)} (registry {address})"


def _build_in_place(plan: Plan, kind: str, trees: dict[str, Path], run_dir: Path) -> Path:
    out = run_dir / "built" / kind
    out.mkdir(parents=True)
    builders.build(BuildRequest(plan, kind, out, {k: trees[k] for k in UPSTREAM[kind]}))
    return out


def _warm(
    settings: StartupSettings,
    plan: Plan,
    trees: dict[str, Path],
    graphs: Installed | None,
    store: Store,
    run_dir: Path,
    log: StepLog,
    built: list[str],
) -> Engine:
    from engine.runtime.autotune import load_winners  # torch: imported here, once the process is about to compile
    from engine.runtime.steps import Tactic

    recipe = plan.recipe
    with log.step("install") as s:
        buckets = BucketSet.from_json(json.loads((trees["buckets"] / builders.BUCKETS_FILE).read_text()))
        winners = load_winners(trees["autotune"] / builders.AUTOTUNE_FILE)
        shapes = step_shapes(buckets, recipe.serving.max_model_len)
        schedule = {shape: winners.get(shape, Tactic()) for shape in shapes}
        if settings.eager:
            s.detail = f"{len(shapes)} step shapes, compilation off"
        else:
            trees["graphs"] = install.private_graphs_tree(graphs, run_dir)
            install.activate(install.engine_environment(trees["graphs"]))
            s.detail = f"{len(shapes)} step shapes, graphs ({recipe.compile.variant}) in {trees['graphs']}"
    with log.step("load") as s:
        from engine.runtime.build import model_and_cache

        model, cache = model_and_cache(recipe, plan.target.dtype)
        s.detail = (
            f"{recipe.model.name} {plan.target.dtype} ({sum(p.numel() for p in model.parameters()):,} parameters)"
        )
    steps = None
    if settings.eager or graphs is not None:
        with log.step("warm-up") as s:
            steps, s.detail = _load_steps(settings, recipe, model, cache, schedule, trees.get("graphs"), log)
    if steps is None:
        if "graphs" not in built:
            built.append("graphs")
        with log.step("compile") as s:
            from engine.runtime.build import compile_graphs

            steps = compile_graphs(model, cache, recipe, schedule, trees["graphs"], log=log.note)
            log.metrics.add("prebake_fallback_compiles_total", kind="graphs")
            s.detail = f"{len(shapes)} step shapes compiled in place ({recipe.compile.variant})"
    return Engine(plan, steps, buckets, schedule, run_dir, store, tuple(built))


def _load_steps(settings, recipe: Recipe, model, cache, schedule, graphs_tree: Path | None, log: StepLog):
    """Warm steps from the installed graphs (or eager ones), and what the warm-up step reports.

    aoti: the precompiled functions, or (when they do not load here) torch.compile over the same
    tree's Inductor cache, with the reason logged (engine.runtime.aot.load_or_fallback)."""
    from engine.runtime.steps import CompiledSteps

    precompiled = False
    if settings.eager:
        steps = CompiledSteps(model, cache, compile=False)
    elif recipe.compile.variant == "aoti":
        from engine.runtime import aot

        steps, fallback = aot.load_or_fallback(model, cache, list(schedule), graphs_tree, mode=recipe.compile.mode)
        precompiled = fallback is None
        if fallback is not None:  # verified bytes that do not load here: the same bundle's Inductor cache serves
            log.note(
                f"aoti: precompiled functions do not load here ({fallback}); warming up from the bundle's Inductor cache"
            )
    else:
        steps = CompiledSteps(model, cache, mode=recipe.compile.mode, expected_shapes=len(schedule))
    steps.warm_up(schedule, log=log.note)
    detail = f"{len(schedule)} step shapes " + (
        "eager" if settings.eager else f"from the bundle ({recipe.compile.variant})"
    )
    if not settings.eager and not precompiled:
        from torch._dynamo.utils import counters

        hits, missed = counters["aot_autograd"]["autograd_cache_hit"], counters["aot_autograd"]["autograd_cache_miss"]
        detail += f"; AOTAutograd cache {hits} hit(s), {missed} miss(es)"
    return steps, detail


def _write_back(
    plan: Plan, built: list[str], trees: dict[str, Path], store: Store, registry, trust, timeout: float, log: StepLog
) -> str:
    """Pack and publish what was built in place, upstream first; a failure is logged, never fatal."""
    from registry.signing import signer_from_env

    outcome: dict[str, str] = {}

    def run() -> None:
        sign = signer_from_env()
        for kind in (k for k in KINDS if k in built):
            try:
                baked = bake_kind(
                    plan, kind, store=store, registry=registry, build=_copy_of(trees[kind]), sign=sign, trust=trust
                )
                outcome[kind] = baked.note
            except Exception as exc:  # reported loudly below; the engine still serves what it compiled
                outcome[kind] = f"failed: {type(exc).__name__}: {exc}"

    worker = threading.Thread(target=run, name="prebake-write-back", daemon=True)
    worker.start()
    worker.join(timeout)
    for kind in (k for k in KINDS if k in built):
        note = outcome.get(kind, f"failed: not finished within {timeout:g} s")
        ok = not note.startswith("failed")
        log.metrics.add("prebake_write_backs_total", kind=kind, outcome="published" if ok else "failed")
        log.note(f"write-back {kind} {plan.key(kind).digest[:12]} to {registry.url}: {note}")
        if not ok:
            log.emit(f"prebake serve: WARNING: write-back of {kind} failed; the next start will compile it again")
    return (
        ", ".join(f"{k}: {'published' if not v.startswith('failed') else 'failed'}" for k, v in outcome.items())
        or "nothing finished"
    )


def _copy_of(tree: Path):
    def build(request: BuildRequest) -> None:
        shutil.copytree(tree, request.out, dirs_exist_ok=True)

    return build
