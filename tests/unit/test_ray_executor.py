"""The Ray executor's pieces that need no cluster: task options, the node-side refusal, the table."""

from __future__ import annotations

from prebake.artifacts.bake.fleet_plan import Profile, requirement
from prebake.artifacts.bake.recipes import Target
from prebake.engine.cli.bake import render
from prebake.engine.common.probe import Host, Platform, Software
from prebake.engine.fleet.ray_executor import FAILED, BakeJob, KindOutcome, RayReport, bake_target, ray_options
from tests.support.baking import REPO
from tests.support.hosts import as_cpu_host

H100 = Host(
    Platform("cuda", "sm_90", "NVIDIA H100 80GB HBM3", 8, ()),
    Software("3.11", "2.13.0+cu128", None, None, None, "12.8", "570"),
)


def test_resource_routing_asks_one_unit_per_accelerator():
    need = requirement(Target("m", "gaudi3", 4, "bf16"), None)
    assert ray_options(need, "resource") == {"num_cpus": 0, "resources": {"prebake-gaudi3": 4.0}}
    cpu = requirement(Target("m", "cpu", 1, "fp32"), None)
    assert ray_options(cpu, "resource")["resources"] == {"prebake-cpu": 1.0}


def test_accelerator_routing_uses_rays_gpu_type_and_hpu_count():
    need = requirement(Target("m", "cuda:sm_90", 8, "fp8"), Profile("h100", H100))
    assert ray_options(need, "accelerator") == {"num_gpus": 8, "accelerator_type": "H100"}
    gaudi = requirement(Target("m", "gaudi2", 2, "bf16"), None)
    assert ray_options(gaudi, "accelerator")["resources"] == {"HPU": 2.0, "prebake-gaudi2": 2.0}


def test_a_node_of_another_platform_refuses_the_bake(monkeypatch):
    as_cpu_host(monkeypatch)
    text = (REPO / "recipes" / "llama3-8b.toml").read_text()
    outcomes = bake_target(BakeJob("llama3-8b", text, "llama3-8b/gaudi3/tp1/bf16", "/nonexistent"))
    assert {o.outcome for o in outcomes} == {FAILED} and len(outcomes) == 3
    assert all("refused: this node is cpu" in o.reason and "needs gaudi3" in o.reason for o in outcomes)
    assert (REPO / "recipes" / "llama3-8b.toml").read_text() == text  # the shipped recipe was not touched


def test_the_table_counts_outcomes():
    rows = [KindOutcome("m/cpu/tp1/fp32", k, "built", node="abc") for k in ("graphs", "buckets", "autotune")]
    text = render(RayReport(tuple(rows), submitted=1))
    assert text.splitlines()[1].split()[1] == "buckets" and text.endswith("1 Ray tasks submitted; 3 built")
