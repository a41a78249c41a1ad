"""Registries seeded with bundles for the exact keys `prebake fetch` computes on this host, fast.

The buckets kind is built for real (pure Python); every other kind gets a tree holding its
declared outputs (`{"shapes": []}` JSON), which is all fetch, gc and the trust checks look at:
no torch.compile, so the policy tests stay quick.
"""

from __future__ import annotations

import json
from pathlib import Path

from prebake.artifacts.bake.bake_kind import ModelSign, Signer, bake_kind
from prebake.artifacts.bake.provenance import Attest
from prebake.artifacts.recipe.kinds import BuildRequest, TargetKeys
from prebake.artifacts.recipe.schema import load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine.common.probe import current_host
from prebake.engine.compose import Context
from prebake.registry import open_registry


def plan_here(model: str = "tiny-llama", precision: str = "bf16") -> TargetKeys:
    """The target `prebake fetch --model MODEL --precision PRECISION` picks on this host."""
    context = Context(Store("/nonexistent-prebake-home"), current_host(), "unused")
    return context.pick_plan(load_recipe(model), dtype=precision)


def seed(
    registry: Path,
    scratch: Path,
    plan: TargetKeys,
    *,
    sign: Signer | None = None,
    build: str = "first",
    attest: Attest | None = None,
    model_sign: ModelSign | None = None,
) -> dict:
    """Publish every kind of `plan` into the folder registry `registry`; manifests by kind."""
    opened = open_registry(str(registry))
    store = Store(scratch)
    out = {}
    for kind in plan.kinds.names:
        declared = plan.kinds[kind]
        builder = None if kind == "buckets" else _outputs_of(declared.outputs, build)
        baked = bake_kind(
            plan, kind, store=store, registry=opened, sign=sign, build=builder, attest=attest, model_sign=model_sign
        )
        out[kind] = baked.manifest
    return out


def _outputs_of(outputs: tuple[str, ...], build: str):
    def build_tree(request: BuildRequest) -> None:
        for name in outputs:
            path = request.out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"shapes": [], "build": build}))

    return build_tree
