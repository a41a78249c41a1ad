"""The Ray executor: every target the plan says needs baking becomes one Ray task that only a matching node runs.

    driver:  plan (index reads only) -> per missing target: wait (bounded) for an alive node
             advertising its resource, submit bake_target there -> one outcome per target x kind
    node:    bake_target re-probes its host, refuses a target of another platform, then runs
             `prebake bake --target` into the shared registry, in a child that dies with its worker

Ray places the tasks and retries those of a dead node; the registry's create-only entries settle
two bakers of one key. Only non-secret settings travel with a task (node_env.py). Routing,
retries and credentials: docs/fleet.md. Ray itself is the optional extra `prebake[ray]`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.bake.fleet_plan import MISSING, PRESENT, UNBUILDABLE, Requirement, TargetPlan, matches
from prebake.artifacts.errors import HostCannotBuildError
from prebake.artifacts.extras import require
from prebake.artifacts.recipe.kinds import target_keys
from prebake.artifacts.recipe.schema import Recipe, load_recipe, targets
from prebake.artifacts.tables import table
from prebake.engine.adapters import kind_names, kinds_for
from prebake.engine.common.probe import probe
from prebake.engine.fleet.node_env import forwarded, registry_used
from prebake.engine.fleet.plan import make_plan

BUILT, ALREADY, FAILED, NO_NODE, NOT_BUILDABLE = "built", "already present", "failed", "no matching node", "unbuildable"
_NOTE = re.compile(r"^prebake: (?P<target>\S+) (?P<kind>\w+): (?P<note>[^,]+),", re.M)
_POLL_S = 1.0


@dataclass(frozen=True)
class RayBake:
    """What `prebake bake --executor ray` was asked: the recipe's narrowed matrix and how to route it."""

    model: str
    precision: str | None = None
    tp: int | None = None
    registry: str | None = None
    profiles: str | None = None  # a builder-profiles file
    address: str | None = None  # the cluster (None: RAY_ADDRESS, else a local one)
    routing: str = "resource"  # "resource" (prebake ray-resources) or "accelerator" (Ray's GPU/HPU counts)
    retries: int = 2
    node_timeout: float = 120.0
    forward_credentials: bool = False  # also send AWS_* credentials and HF_TOKEN to the nodes (node_env.py)


@dataclass(frozen=True)
class RayReport:
    """Every (target, kind) of the matrix with its outcome; it renders itself for `prebake bake`."""

    rows: tuple[KindOutcome, ...]
    submitted: int

    @property
    def failed(self) -> bool:
        return any(r.outcome in (FAILED, NO_NODE) for r in self.rows)

    def render(self) -> str:
        """A table, one row per target x kind (kinds in build order), then the counts."""
        order = kind_names()
        rank = {kind: i for i, kind in enumerate(order)}
        body = [
            (r.target, r.kind, r.outcome, r.node or "-", r.reason[:160])
            for r in sorted(self.rows, key=lambda r: (r.target, rank.get(r.kind, len(order)), r.kind))
        ]
        counts = {
            o: sum(1 for r in self.rows if r.outcome == o) for o in (BUILT, ALREADY, FAILED, NO_NODE, NOT_BUILDABLE)
        }
        summary = f"{self.submitted} Ray tasks submitted; " + ", ".join(f"{n} {o}" for o, n in counts.items() if n)
        return table(("TARGET", "KIND", "OUTCOME", "NODE", "REASON"), body) + "\n" + summary


@dataclass(frozen=True)
class KindOutcome:
    target: str
    kind: str
    outcome: str
    reason: str = ""
    node: str = ""


@dataclass(frozen=True)
class BakeJob:
    """What one Ray task receives: the recipe itself (nodes need no copy), the target and the registry."""

    recipe_name: str
    recipe_toml: str
    target_id: str
    registry: str | None


# --- the node side ---------------------------------------------------------------------------


def bake_target(job: BakeJob) -> tuple[KindOutcome, ...]:
    """Runs on a Ray node: refuse another platform, else bake the target and say what each kind did."""
    host = probe()
    node = _node_id()
    with tempfile.TemporaryDirectory(prefix="prebake-ray-") as tmp:
        folder = Path(tmp) / "recipes"
        folder.mkdir()
        (folder / f"{job.recipe_name}.toml").write_text(job.recipe_toml)
        recipe = load_recipe(job.recipe_name, folder)
        target = next(t for t in targets(recipe) if t.name == job.target_id)
        if not matches(target, host):
            why = f"refused: this node is {host.platform.describe()}, the target needs {target.platform}"
            return tuple(KindOutcome(target.name, kind, FAILED, why, node) for kind in kinds_for(recipe, target).names)
        try:
            before = _present(recipe, target, host, job.registry)
        except Exception as exc:  # the registry as this node sees it: say which, and with what settings
            why = f"{type(exc).__name__}: {exc}; {registry_used(os.environ, job.registry)}"
            return tuple(KindOutcome(target.name, kind, FAILED, why, node) for kind in kinds_for(recipe, target).names)
        proc = _run_bake(job, folder)
    said = {m["kind"]: m["note"] for m in _NOTE.finditer(proc.stdout) if m["target"] == job.target_id}
    tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[-300:]
    outcomes = []
    for kind in kinds_for(recipe, target).names:
        if kind in before:
            outcomes.append(KindOutcome(target.name, kind, ALREADY, "", node))
        elif kind in said:
            built = said[kind].startswith("published")
            outcomes.append(
                KindOutcome(target.name, kind, BUILT if built else ALREADY, "" if built else said[kind], node)
            )
        elif proc.returncode == 0:
            outcomes.append(KindOutcome(target.name, kind, ALREADY, "up to date", node))
        else:
            why = f"bake exited {proc.returncode}: {tail}; {registry_used(os.environ, job.registry)}"
            outcomes.append(KindOutcome(target.name, kind, FAILED, why, node))
    return tuple(outcomes)


def _node_id() -> str:
    """The Ray node this task runs on (its id's first 12 digits), else host:pid outside Ray. Ray's
    runtime context is asked only inside a Ray worker: asked elsewhere, Ray starts a whole local
    instance to answer (a head, an object store sized to the machine's memory, a dashboard)."""
    try:
        import ray  # the optional extra: bake_target also runs, and is tested, without a cluster

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()[:12]
    except Exception:
        pass
    return f"{os.uname().nodename}:{os.getpid()}"


def _present(recipe: Recipe, target, host, registry_address: str | None) -> set[str]:
    from prebake.artifacts.fetch.gate import accepted_entry
    from prebake.engine.compose import Context

    context = Context.open(registry_address, host=host, creating=True)  # the bake creates it
    registry = context.registry
    kinds = kinds_for(recipe, target)
    keys = target_keys(recipe, target, host, kinds).keys
    # an entry the policy in force refuses is work to do, not present
    return {
        kind for kind in kinds.names if accepted_entry(registry, kind, keys[kind].digest, context.trust) is not None
    }


def _run_bake(job: BakeJob, recipes: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "prebake.engine.cli", "bake", "--model", job.recipe_name, "--target", job.target_id]
    if job.registry:
        argv += ["--registry", job.registry]
    env = {**os.environ, "PREBAKE_RECIPES": str(recipes)}
    return subprocess.run(argv, env=env, capture_output=True, text=True, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """In the bake child: SIGKILL when the Ray worker that started it dies (Linux prctl)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# --- the driver side -------------------------------------------------------------------------


def runtime_env(credentials: bool, env: Mapping[str, str] = os.environ) -> dict:
    """Ray's runtime_env option carrying the driver's registry settings (engine/fleet/node_env.py)."""
    return {"runtime_env": {"env_vars": forwarded(env, credentials=credentials)}}


def ray_options(need: Requirement, routing: str) -> dict:
    """The Ray task options that place a target's bake only on a node that can build it.

    resource     the custom resource `prebake ray-resources` prints (any cluster)
    accelerator  CUDA: TP GPUs of Ray's accelerator_type named by the profile's GPU ("H100");
                 Gaudi: TP HPUs, plus the custom resource naming the generation (Ray's HPU
                 resource does not tell Gaudi2 from Gaudi3); CPU targets: the custom resource
    """
    if routing == "accelerator" and need.device == "cuda":
        gpu = _ray_gpu_type(need.device_name)
        if gpu is None:
            raise HostCannotBuildError(
                f"cannot route {need.platform} by accelerator type: no profile names its GPU "
                f"({need.device_name or 'unknown'}); declare one with `prebake profile` or use --ray-routing resource"
            )
        return {"num_gpus": need.accelerators, "accelerator_type": gpu}
    if routing == "accelerator" and need.device == "gaudi":
        return {"resources": {"HPU": float(need.accelerators), need.custom_resource: float(need.accelerators)}}
    return {"num_cpus": 0, "resources": need.ray_resources()}


def _ray_gpu_type(device_name: str) -> str | None:
    """Ray's accelerator type constant for an NVIDIA product name: "NVIDIA H100 80GB HBM3" -> "H100"."""
    found = re.search(r"\b(GH200|H200|H100|H20|B200|A100|A10G|L40S|L4|T4|V100)\b", device_name)
    return found.group(1) if found else None


def bake_on_ray(options: RayBake) -> RayReport:
    """`prebake bake --executor ray`: bake every missing target on a matching node, and say how each went."""
    fleet = make_plan(
        options.model, precision=options.precision, tp=options.tp, registry=options.registry, profiles=options.profiles
    )
    rows: list[KindOutcome] = []
    todo: list[TargetPlan] = []
    for t in fleet.targets:
        if t.status == PRESENT:
            rows += [KindOutcome(t.id, k.kind, ALREADY) for k in t.kinds]
        elif t.status == UNBUILDABLE:
            rows += [KindOutcome(t.id, k.kind, NOT_BUILDABLE, t.reason) for k in t.kinds]
        else:
            todo.append(t)
    if todo:
        rows += _run_on_ray(todo, load_recipe(options.model), options)
    return RayReport(tuple(rows), submitted=len(todo))


def _run_on_ray(todo: list[TargetPlan], recipe: Recipe, args: RayBake) -> list[KindOutcome]:
    require("ray", "--executor ray")  # the optional extra, needed only when something is to be submitted
    import ray

    ray.init(address=args.address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        return _collect(ray, todo, recipe, args)
    finally:
        ray.shutdown()


def _collect(ray, todo: list[TargetPlan], recipe: Recipe, args: RayBake) -> list[KindOutcome]:
    remote = ray.remote(bake_target)
    text = _recipe_text(args.model, recipe)
    rows: list[KindOutcome] = []
    waiting = {t.id: t for t in todo}  # not submitted yet: no matching node seen
    running: dict = {}  # ObjectRef -> (TargetPlan, last time a matching node was seen)
    deadline = time.monotonic() + args.node_timeout
    while waiting or running:
        nodes = _alive_resources(ray)
        for tid, t in list(waiting.items()):
            if _has_node(nodes, t.requirement, args.routing):
                job = BakeJob(recipe.model.name, text, tid, args.registry)
                options = ray_options(t.requirement, args.routing) | runtime_env(args.forward_credentials)
                ref = remote.options(max_retries=args.retries, retry_exceptions=False, **options).remote(job)
                running[ref] = (t, time.monotonic())
                del waiting[tid]
            elif time.monotonic() > deadline:
                rows += _all(
                    t,
                    NO_NODE,
                    f"no alive node advertised {_wanted(t.requirement, args.routing)} within {args.node_timeout:g} s",
                )
                del waiting[tid]
        if running:
            done, _ = ray.wait(list(running), num_returns=1, timeout=_POLL_S)
            for ref in done:
                t, _seen = running.pop(ref)
                rows += _result(ray, ref, t)
            for ref, (t, seen) in list(running.items()):  # a task whose every matching node left never starts
                if _has_node(nodes, t.requirement, args.routing):
                    running[ref] = (t, time.monotonic())
                elif time.monotonic() - seen > args.node_timeout:
                    ray.cancel(ref, force=True)
                    running.pop(ref)
                    rows += _all(t, NO_NODE, f"every node advertising {_wanted(t.requirement, args.routing)} left")
        else:
            time.sleep(_POLL_S)
    return rows


def _result(ray, ref, t: TargetPlan) -> list[KindOutcome]:
    try:
        return list(ray.get(ref))
    except Exception as exc:  # a task error, a dead worker or node past its retries: the target failed
        exc = getattr(exc, "cause", None) or exc  # RayTaskError wraps the node's own exception
        first = str(exc).strip().splitlines()
        return _all(t, FAILED, f"{type(exc).__name__}: {first[0][:200] if first else ''}")


def _alive_resources(ray) -> list[dict[str, float]]:
    return [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]


def _has_node(nodes: list[dict[str, float]], need: Requirement, routing: str) -> bool:
    wanted = _wanted_resources(need, routing)
    return any(all(node.get(name, 0) >= amount for name, amount in wanted.items()) for node in nodes)


def _wanted_resources(need: Requirement, routing: str) -> dict[str, float]:
    options = ray_options(need, routing)
    wanted = dict(options.get("resources", {}))
    if options.get("num_gpus"):
        wanted["GPU"] = float(options["num_gpus"])
    if options.get("accelerator_type"):
        wanted[f"accelerator_type:{options['accelerator_type']}"] = 0.001
    return wanted


def _wanted(need: Requirement, routing: str) -> str:
    return ", ".join(f"{name}={amount:g}" for name, amount in _wanted_resources(need, routing).items())


def _all(t: TargetPlan, outcome: str, reason: str) -> list[KindOutcome]:
    return [KindOutcome(t.id, k.kind, outcome, reason) for k in t.kinds]


def _recipe_text(model: str, recipe: Recipe) -> str:
    from prebake.artifacts.recipe.catalog import recipe_dirs

    path = (
        Path(model)
        if model.endswith(".toml")
        else next(d / f"{recipe.model.name}.toml" for d in recipe_dirs() if (d / f"{recipe.model.name}.toml").exists())
    )
    return path.read_text()


__all__ = ["MISSING", "BakeJob", "KindOutcome", "RayBake", "RayReport", "bake_on_ray", "bake_target", "ray_options"]
