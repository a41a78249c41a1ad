"""The Ray executor's pieces that need no cluster: task options, the node-side refusal, the table."""

from __future__ import annotations

from prebake.artifacts.bake.fleet_plan import Profile, requirement
from prebake.artifacts.recipe.schema import Target
from prebake.engine.common.probe import Host, Platform, Software
from prebake.engine.fleet.ray_executor import FAILED, BakeJob, KindOutcome, RayReport, bake_target, ray_options
from tests.support.baking import REPO
from tests.support.hosts import as_cpu_host

NO_ENGINE_PACKAGES = (("vllm", None), ("vllm_gaudi", None))  # the vLLM adapter's, not installed

H100 = Host(
    Platform("cuda", "sm_90", "NVIDIA H100 80GB HBM3", 8, ()),
    Software("3.11", "2.13.0+cu128", None, None, "12.8", "570", packages=NO_ENGINE_PACKAGES),
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
    text = RayReport(tuple(rows), submitted=1).render()
    assert text.splitlines()[1].split()[1] == "buckets" and text.endswith("1 Ray tasks submitted; 3 built")


# -- what a node sees of the driver's settings -----------------------------------------------------

DRIVER = {
    "AWS_ENDPOINT_URL": "http://minio.internal:9000",
    "AWS_DEFAULT_REGION": "eu-west-1",
    "HF_ENDPOINT": "http://hub.internal",
    "PREBAKE_S3_TIMEOUT_S": "5",
    "PREBAKE_REGISTRY": "s3://team/prebake",
    "PREBAKE_HOME": "/home/driver/.cache/prebake",
    "PREBAKE_TEST_CRASH_AT": "pack",
    "AWS_ACCESS_KEY_ID": "AKIA-driver",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "HF_TOKEN": "hf_secret",
    "PATH": "/usr/bin",
}


def test_the_registry_settings_that_are_not_secrets_travel_in_the_runtime_env():
    from prebake.engine.fleet.ray_executor import runtime_env

    sent = runtime_env(False, DRIVER)["runtime_env"]["env_vars"]
    assert sent == {
        "AWS_ENDPOINT_URL": "http://minio.internal:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "HF_ENDPOINT": "http://hub.internal",
        "PREBAKE_S3_TIMEOUT_S": "5",
        "PREBAKE_REGISTRY": "s3://team/prebake",
    }


def test_credentials_travel_only_when_asked():
    from prebake.engine.fleet.node_env import forwarded

    assert "AWS_SECRET_ACCESS_KEY" not in forwarded(DRIVER)
    sent = forwarded(DRIVER, credentials=True)
    assert sent["AWS_SECRET_ACCESS_KEY"] == "secret" and sent["HF_TOKEN"] == "hf_secret"
    assert "PREBAKE_HOME" not in sent and "PATH" not in sent  # the node's own


def test_a_node_that_cannot_reach_the_registry_names_the_address_and_its_settings(monkeypatch):
    """A real S3 client against a loopback port nobody listens on: the failure says where it went."""
    from tests.support.ports import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "PREBAKE_S3_MAX_ATTEMPTS": "1",
        "PREBAKE_S3_TIMEOUT_S": "2",
    }.items():
        monkeypatch.setenv(name, value)
    text = (REPO / "recipes" / "tiny-llama.toml").read_text()
    outcomes = bake_target(BakeJob("tiny-llama", text, "tiny-llama/cpu/tp1/fp32", "s3://prebake-team/bundles"))
    assert {o.outcome for o in outcomes} == {FAILED}
    reason = outcomes[0].reason
    assert "RegistryUnavailable" in reason and "registry s3://prebake-team/bundles, as this node saw it" in reason
    assert f"AWS_ENDPOINT_URL={endpoint}" in reason and "credentials: AWS_ACCESS_KEY_ID set" in reason
    assert "testing" not in reason  # a credential's value is never shown
