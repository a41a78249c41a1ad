"""A new artifact kind is one declaration: a kind declared here, in the test, bakes through doit,
publishes, fetches from an empty store and exports its environment, without editing any module."""

from __future__ import annotations

import json
from pathlib import Path

from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain

from prebake.artifacts.bake.tasks import BakeRequest, bake_tasks
from prebake.artifacts.fetch.pipeline import Source, resolve
from prebake.artifacts.recipe.kinds import (
    BUCKETS,
    BUCKETS_FILE,
    BuildRequest,
    Groups,
    KeyContext,
    Kind,
    KindTable,
    TargetKeys,
    target_keys,
)
from prebake.artifacts.recipe.schema import Recipe, load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine.common.exports import prebake_environment
from prebake.engine.common.probe import current_host
from prebake.engine.compose import Context
from prebake.registry import open_registry

TOY_FILE = "toy.json"
BUILT: list[str] = []  # targets the toy builder ran for


def _toy_groups(context: KeyContext) -> Groups:
    return {"serving": {"max_num_seqs": context.recipe.serving.max_num_seqs}, "toy": {"version": "1"}}


def _build_toy(request: BuildRequest) -> None:
    BUILT.append(request.plan.target.name)
    buckets = json.loads((request.inputs["buckets"] / BUCKETS_FILE).read_text())
    summary = {"prompt_buckets": len(buckets["prompt"]), "decode_buckets": len(buckets["decode"])}
    (request.out / TOY_FILE).write_text(json.dumps(summary))


TOY = Kind(
    name="toy",
    upstream=("buckets",),
    groups=_toy_groups,
    outputs=(TOY_FILE,),
    build=_build_toy,
    environment=lambda tree: {"TOY_SUMMARY_FILE": str(tree / TOY_FILE)},
)


class ToyContext(Context):
    """The composition root with one more kind in every target's table (and no torch kinds)."""

    def plans(self, recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> list[TargetKeys]:
        return [
            target_keys(recipe, p.target, self.host, KindTable([BUCKETS, TOY]))
            for p in super().plans(recipe, dtype=dtype, tp=tp)
        ]


def test_a_kind_declared_in_a_test_bakes_publishes_fetches_and_installs(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    registry_dir = tmp_path / "registry"
    baker = ToyContext(Store(tmp_path / "baker-home"), current_host(), str(registry_dir), creating=True)  # it bakes

    def task_bake():
        yield from bake_tasks(BakeRequest("tiny-llama", precision="fp32"), open_baker=lambda _registry: baker)

    def run_doit() -> int:
        loader = ModuleTaskLoader({"task_bake": task_bake, "DOIT_CONFIG": {"dep_file": str(tmp_path / "doit.db")}})
        return DoitMain(loader).run(["run", "bake"])

    assert run_doit() == 0
    registry = open_registry(registry_dir)
    listed = {m.kind: m for m in registry.list()}
    assert set(listed) == {"buckets", "toy"}
    assert listed["toy"].inputs == {"buckets": listed["buckets"].blob.digest}  # built from its upstream's tree

    consumer = Store(tmp_path / "consumer-home")
    target_plan = baker.plans(load_recipe("tiny-llama"), dtype="fp32")[0]
    got = resolve(target_plan, store=consumer, source=Source(str(registry_dir), None, open_registry))
    assert got.complete and set(got.installed) == {"buckets", "toy"}
    env = prebake_environment(target_plan.kinds, got.installed)
    summary = json.loads(Path(env["TOY_SUMMARY_FILE"]).read_text())
    assert summary["prompt_buckets"] > 0 and summary["decode_buckets"] > 0
    assert Path(env["PREBAKE_BUCKETS_FILE"]).is_file()

    assert BUILT == ["tiny-llama/cpu/tp1/fp32"]
    assert run_doit() == 0  # nothing changed: every task is up to date, nothing is built again
    assert BUILT == ["tiny-llama/cpu/tp1/fp32"]


def test_a_kind_table_refuses_a_kind_before_its_upstream():
    import pytest

    from prebake.artifacts.errors import PrebakeError

    with pytest.raises(PrebakeError, match="built from \\['buckets'\\], which are not declared before it"):
        KindTable([TOY, BUCKETS])
