"""The bundled engine's adapter: autotune tactics and an Inductor cache (or Dynamo precompile) as
graphs (the trees are drawn in prebake.engine.bundled.cache_layout), and its fetch and serve.

Both are built by torch in a child process (`python -m prebake.engine.bundled.build`), so the parent
never imports torch (a no-op bake stays fast) and the child's environment (its private
TORCHINDUCTOR_CACHE_DIR, PYTHONHASHSEED) is set explicitly and never leaks into the parent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from prebake.artifacts.errors import BuildError, CheckpointError, RecipeError
from prebake.artifacts.extras import require
from prebake.artifacts.recipe.kinds import (
    BuildRequest,
    Groups,
    KeyContext,
    Kind,
    TargetKeys,
    compile_factors,
    target_groups,
)
from prebake.artifacts.recipe.quantization import scheme_of
from prebake.artifacts.recipe.schema import parse_platform
from prebake.artifacts.store.local import Installed
from prebake.engine.bundled.cache_layout import (
    AUTOTUNE_ENV,
    AUTOTUNE_FILE,
    FALLBACK_KIND,
    GRAPHS_ENV,
    GRAPHS_FILE,
    INDUCTOR_DIR,
    engine_environment,
    fetched_cache,
    private_graphs_tree,
    temp_dir,
)
from prebake.engine.bundled.runtime import gemv
from prebake.engine.bundled.snapshot import kind as snapshot_kind
from prebake.engine.bundled.snapshot.serving import snapshot_mode
from prebake.engine.bundled.variants import DEFAULT_VARIANT, served, variant_of
from prebake.engine.common import starter
from prebake.engine.common.adapter import (
    EngineOption,
    EngineSpec,
    Fetched,
    OpenServices,
    Services,
    StartRequest,
    plan_to_start,
)
from prebake.engine.common.exports import prebake_environment


def child_env(kind: str, out: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a build child: a private Inductor cache for graphs, nothing shared."""
    env = dict(base if base is not None else os.environ)
    if kind == "graphs":
        env["TORCHINDUCTOR_CACHE_DIR"] = str(out / INDUCTOR_DIR)
    else:  # autotune compiles nothing it keeps: keep its scratch out of any shared cache
        env["TORCHINDUCTOR_CACHE_DIR"] = str(out.parent / "inductor-scratch")
    env["TMPDIR"] = str(temp_dir(out.parent))  # the build's scratch folder: gone with it, killed or not
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def build_in_child(request: BuildRequest) -> None:
    """Build autotune or graphs with torch in `python -m prebake.engine.bundled.build`."""
    require("torch", f"baking {request.kind}")
    target = request.plan.target
    refused = request.out.parent / f"{request.kind}-refused.json"
    spec = {
        "kind": request.kind,
        "recipe": request.plan.recipe.model_dump(mode="json"),
        "target": {"platform": target.platform, "tp": target.tp, "dtype": target.dtype},
        "inputs": {k: str(v) for k, v in request.inputs.items()},
        "out": str(request.out),
        # where the child leaves a refusal of the user's files (a checkpoint, a recipe's config the
        # runtime cannot run), raised here as it is, not as a failed build
        "refusal": str(refused),
    }
    spec_path = request.out.parent / f"{request.kind}-request.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", "prebake.engine.bundled.build", str(spec_path)],
        env=child_env(request.kind, request.out),
        cwd=request.out.parent,
    )
    if proc.returncode != 0 and refused.is_file():
        told = json.loads(refused.read_text())
        raise (RecipeError if told["type"] == "RecipeError" else CheckpointError)(told["message"])
    if proc.returncode != 0:
        raise BuildError(
            f"building {request.kind} of {target.name} failed (exit {proc.returncode}); "
            f"its output is above; nothing was published"
        )


def _autotune_groups(context: KeyContext) -> Groups:
    options = {**context.recipe.autotune.key_options(), "method": "interleaved-medians-ties"}
    return {**target_groups(context), "options": options}  # method: how runtime.autotune measures


def _graphs_groups(context: KeyContext) -> Groups:
    """The target's groups and the [compile] options, with what the recipe's graphs variant adds;
    kernel_threads: kernels read their thread count at run time (runtime.steps.threads_at_run_time);
    decode_matmuls: one-row products and one-query attention compiled as Inductor reductions
    (runtime.gemv), at every precision but fp8, whose steps stay as they were (so its keys did not
    move), and an AOTInductor package's bf16 and fp32 products on a CPU with AMX by runtime.dot's kernel;
    at fp8 the weights' FP8 scheme (format, granularity, activation scheme, excluded modules)."""
    options = compile_factors(context.recipe, DEFAULT_VARIANT)
    graphs = variant_of(context.recipe)  # checked when the adapter was picked (EngineSpec.graphs_variant)
    factors = {**options, **graphs.key_factors(context.recipe.compile), "kernel_threads": "run-time"}
    if context.target.dtype != "fp8":
        factors["decode_matmuls"] = _decode_matmuls(context, graphs.links_kernels)
    groups = {**target_groups(context), "options": factors}
    if context.target.dtype == "fp8":  # absent at every other precision: their keys never moved
        groups["quantization"] = scheme_of(context.recipe.model).factors()
    return groups


def _decode_matmuls(context: KeyContext, links_kernels: bool) -> str:
    # the kernel only where the variant's compile links it (the AOTInductor package), for a CPU target
    isa = str(context.host.platform.factors().get("isa", "")).split(",")
    linked = links_kernels and parse_platform(context.target.platform)[0] == "cpu"
    return gemv.key(context.target.dtype, isa if linked else ())


def autotune_labels(tree: Path) -> dict[str, str]:
    """What `prebake ls` shows of an autotune tree: the conditions its timings were taken under
    (runtime.autotune), read as JSON so listing and baking never import torch."""
    try:
        document = json.loads((tree / AUTOTUNE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    conditions, rows = document.get("conditions"), document.get("shapes", [])
    if not isinstance(conditions, dict):  # measured before conditions were recorded
        return {}
    widest = max((_relative_spread(row) for row in rows), default=0.0)
    return {
        "autotune.cpus": str(conditions.get("cpus", "")),
        "autotune.affinity": ",".join(str(c) for c in conditions.get("affinity", [])),
        "autotune.load_average": " ".join(f"{v:.2f}" for v in conditions.get("load_average", [])),
        "autotune.ties": f"{sum(bool(row.get('tie')) for row in rows)}/{len(rows)}",
        "autotune.widest_spread": f"{widest:.0%}",
    }


def _relative_spread(row: dict) -> float:
    spreads, medians = row.get("spread_ms", {}), row.get("timings_ms", {})
    return max(((hi - lo) / medians[k] for k, (lo, hi) in spreads.items() if medians.get(k)), default=0.0)


AUTOTUNE = Kind(
    name="autotune",
    upstream=("buckets",),
    groups=_autotune_groups,
    outputs=(AUTOTUNE_FILE,),
    build=build_in_child,
    environment=lambda tree: {AUTOTUNE_ENV: str(tree / AUTOTUNE_FILE)},
    labels=autotune_labels,
)

GRAPHS = Kind(
    name="graphs",
    upstream=("buckets", "autotune"),
    groups=_graphs_groups,
    outputs=(GRAPHS_FILE,),
    build=build_in_child,
    environment=lambda tree: {GRAPHS_ENV: str(tree)},  # read-only; fetch adds a writable Inductor cache
)


SPEC = EngineSpec(
    name="prebake",
    kinds=(AUTOTUNE, GRAPHS),
    fallback_kind=FALLBACK_KIND,  # compiled in its serving process on a miss (start.py reads it there)
    variants=served(),  # prebake.engine.bundled.variants: one module and one registration line each
    packages=(),  # torch and its stack are every kind's factors already (prebake.engine.common.probe.Software)
    settings=None,  # it reads [compile] and [autotune]; it has no [engine] table
    refuses=lambda recipe, target: variant_of(recipe).refuses(target),  # e.g. a variant traced on one rank, at tp 2
    options=(
        EngineOption(
            "--eager", "compilation off: serve the eager model (the benchmark's floor)", type=bool, default=False
        ),
        EngineOption(
            "--reject-unknown-fields",
            "answer a request field this API does not know with a 400, as OpenAI does (default: "
            "$PREBAKE_REJECT_UNKNOWN_FIELDS=1; otherwise ignored, logged once and named in X-Ignored-Fields, as vLLM)",
            type=bool,
            default=False,
        ),
        EngineOption(
            "--api-key",
            "require `Authorization: Bearer KEY` on every route but the health probes "
            "(default: $PREBAKE_API_KEY; none: no authentication)",
        ),
        EngineOption(
            "--snapshot",
            "auto (default): restore the target's process snapshot when its recipe bakes one and this host "
            "can, else start from the bundles, one line saying why; require: exit 3 instead; never: do not try",
            type=snapshot_mode,
            default="auto",
        ),
        EngineOption(
            "--park",
            "start, then wait to be dumped (the bake's snapshot step runs it; not for a server)",
            type=bool,
            default=False,
        ),
    ),
    optional_kinds=snapshot_kind.wanted,  # [snapshot] bake = true: the snapshot kind after graphs
)


class BundledAdapter:
    """prebake's own engine (`prebake serve`): compiles and serves in its own process."""

    spec = SPEC

    def serve_environment(self, plan: TargetKeys, installed: Mapping[str, Installed], run_dir: Path) -> dict[str, str]:
        return engine_environment(private_graphs_tree(installed.get("graphs"), run_dir))

    def fetch(self, request: StartRequest, services: Services) -> Fetched:
        """The bundled engine (and plain torch.compile users): every installed kind's variables."""
        SPEC.options_of(request)
        plan = plan_to_start(request, services)
        resolution = starter.fetch_bundles(plan, request, services)
        optional = {kind.name for kind in SPEC.optional_kinds(plan.recipe, plan.target)}  # a snapshot: noted only
        misses = tuple(m for m in resolution.misses if m.key.kind not in optional)
        notes = (
            *resolution.notes,
            *(f"{m.key.kind} not fetched: {m.reason}" for m in resolution.misses if m.key.kind in optional),
        )
        if misses:
            note = f"no complete bundle set for {plan.target.name} in {services.source.address}"
            return Fetched(plan.target.name, {}, resolution.installed, misses, (*notes, note))
        env = prebake_environment(plan.kinds, resolution.installed)
        if (graphs := resolution.installed.get("graphs")) is not None and not services.store.read_only:
            cache = fetched_cache(graphs, services.store.cache_path(graphs.manifest))
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        return Fetched(plan.target.name, env, resolution.installed, notes=notes)

    def serve(self, request: StartRequest, open_services: OpenServices) -> int:
        """`prebake serve`: listen, then the shared starter with this engine's in-process runner
        (prebake.engine.bundled.serve and .start)."""
        import logging

        require("serve", "prebake serve")
        require("torch", "prebake serve")
        from prebake.engine.bundled.snapshot.serving import handed_over, serve_or_say

        options = SPEC.options_of(request)
        if options["park"]:  # the bake's snapshot step started this process (prebake.engine.bundled.snapshot.dump)
            from prebake.engine.bundled.parked import serve_parked

            return serve_parked(request, open_services)
        emit = logging.getLogger("prebake.serve").info
        host, port = request.host or "127.0.0.1", 8000 if request.port is None else request.port
        api_key = cast(str | None, options["api_key"])
        restored = serve_or_say(  # before the HTTP server's imports: a restore needs none of them
            str(options["snapshot"]),
            request,
            handed_over(host, port, api_key, bool(options["reject_unknown_fields"])),
            open_services,
            emit,
        )
        if restored is not None:
            return restored
        from prebake.engine.bundled.serve import ServeSettings, api_key_from, reject_unknown_fields_from, serve

        settings = ServeSettings(
            request=request,
            eager=bool(options["eager"]),
            host=host,
            port=port,
            api_key=api_key_from(api_key),
            reject_unknown_fields=reject_unknown_fields_from(bool(options["reject_unknown_fields"])),
        )
        return serve(settings, open_services, emit=emit)
