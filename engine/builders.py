"""The builder of each artifact kind, and the doit action that bakes one kind.

    buckets   pure Python, in this process: buckets.json
    autotune  torch, in a child process (engine.runtime.build): autotune.json
    graphs    torch.compile, in a child process (engine.runtime.build) whose Inductor cache folder
              is the artifact: inductor/ + graphs.json
    engine = "vllm" recipes: autotune and graphs come from vLLM's own start-up (engine.adapters.vllm)

Torch work runs in a child so that the parent never imports torch (a no-op bake stays
fast) and so the child's environment (TORCHINDUCTOR_CACHE_DIR, thread counts) is set
explicitly, in one place, and never leaks into the parent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from artifacts.bake import Baked, BuildRequest, bake_kind
from artifacts.buckets import build_bucket_set
from artifacts.errors import BuildError
from artifacts.kinds import Plan
from artifacts.store import Store

BUCKETS_FILE = "buckets.json"
AUTOTUNE_FILE = "autotune.json"
GRAPHS_FILE = "graphs.json"
INDUCTOR_DIR = "inductor"


def build(request: BuildRequest) -> None:
    """Fill `request.out` with the artifact of `request.kind`."""
    if request.plan.recipe.model.engine == "vllm" and request.kind in ("autotune", "graphs"):
        from .adapters.vllm import build as build_for_vllm  # vLLM compiles in its own process

        build_for_vllm(request)
    elif request.kind == "buckets":
        bucket_set = build_bucket_set(request.plan.recipe.serving, request.plan.recipe.buckets)
        (request.out / BUCKETS_FILE).write_text(json.dumps(bucket_set.to_json(), indent=1, sort_keys=True))
    elif request.kind in ("autotune", "graphs"):
        _run_child(request)
    else:
        raise BuildError(f"no builder for artifact kind {request.kind!r}")


def child_env(kind: str, out: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a build child: a private Inductor cache for graphs, nothing shared."""
    env = dict(base if base is not None else os.environ)
    if kind == "graphs":
        env["TORCHINDUCTOR_CACHE_DIR"] = str(out / INDUCTOR_DIR)
    else:  # autotune compiles nothing it keeps: keep its scratch out of any shared cache
        env["TORCHINDUCTOR_CACHE_DIR"] = str(out.parent / "inductor-scratch")
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def run_kind(plan: Plan, kind: str, registry, store: Store | None = None) -> bool:
    """doit action: bake one kind of one target and say what happened, with its duration."""
    from registry.signing import signer_from_env, trust_from_env

    started = time.monotonic()
    baked: Baked = bake_kind(
        plan,
        kind,
        store=store or Store(),
        registry=registry,
        build=build,
        sign=signer_from_env(),
        trust=trust_from_env(),
    )
    seconds = time.monotonic() - started
    print(
        f"prebake: {plan.target.name} {kind}: {baked.note}, key {baked.manifest.key_digest[:16]}, "
        f"blob {baked.manifest.blob.hex[:16]} ({baked.manifest.blob.size} bytes) in {seconds:.1f} s",
        flush=True,
    )
    return True


def _run_child(request: BuildRequest) -> None:
    spec = {
        "kind": request.kind,
        "recipe": request.plan.recipe.model_dump(mode="json"),
        "target": {
            "platform": request.plan.target.platform,
            "tp": request.plan.target.tp,
            "dtype": request.plan.target.dtype,
        },
        "inputs": {k: str(v) for k, v in request.inputs.items()},
        "out": str(request.out),
    }
    spec_path = request.out.parent / f"{request.kind}-request.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", "engine.runtime.build", str(spec_path)],
        env=child_env(request.kind, request.out),
        cwd=request.out.parent,
    )
    if proc.returncode != 0:
        raise BuildError(
            f"building {request.kind} of {request.plan.target.name} failed (exit {proc.returncode}); "
            f"its output is above; nothing was published"
        )
