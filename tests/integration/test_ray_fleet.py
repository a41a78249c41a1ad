"""Fleet bakes on a local Ray cluster: routing by advertised resource, refusal, no matching node,
two CPU nodes baking in parallel into moto S3, a no-op re-run, a node SIGKILLed mid-bake.

The cluster (a head and four worker nodes on loopback) is started once for the module by
`ray start --block` processes and stopped by their process groups. Two shared cores: the
bake tests use a shrunken tiny-llama (one layer, two bucket shapes) so torch.compile stays
within minutes, and are marked slow.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray executor needs the optional extra: pip install 'prebake[ray]'")

from prebake.artifacts.recipe.schema import load_recipe
from tests.support.baking import REPO
from tests.support.hosts import cpu_only_env
from tests.support.moto_server import moto_server, s3_env
from tests.support.ray_cluster import ray_cluster
from tests.support.recipe_files import write_recipe

FAKE_HABANA = REPO / "tests" / "support" / "fake_habana"
PREBAKE = Path(sys.executable).parent / "prebake"


def _recipe(
    name: str, folder: Path, *, platforms: tuple[str, ...], dtypes: tuple[str, ...], small: bool = False
) -> None:
    base = load_recipe("tiny-llama")
    config = dict(base.model.config, num_hidden_layers=1) if small else base.model.config
    serving = (
        base.serving.model_copy(update={"max_model_len": 64, "max_num_seqs": 1, "max_num_batched_tokens": 64})
        if small
        else base.serving
    )
    recipe = base.model_copy(
        update={
            "model": base.model.model_copy(update={"name": name, "config": config}),
            "serving": serving,
            "matrix": base.matrix.model_copy(update={"platform": platforms, "dtype": dtypes}),
        }
    )
    write_recipe(recipe, folder)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """(cluster, env, recipes folder, bucket): moto S3, a Ray head, two CPU nodes, a simulated
    Gaudi3 node (the fake habana stack) and a node that advertises Gaudi2 but is a CPU host."""
    import boto3

    root = tmp_path_factory.mktemp("ray-fleet")
    recipes = root / "recipes"
    _recipe("fleet-gaudi", recipes, platforms=("gaudi3", "gaudi2"), dtypes=("bf16",), small=True)
    _recipe("fleet-cuda", recipes, platforms=("cuda:sm_90",), dtypes=("bf16",))
    _recipe("fleet-tiny", recipes, platforms=("cpu",), dtypes=("bf16", "fp32"), small=True)
    with moto_server() as endpoint:
        aws = s3_env(endpoint)
        # the CPU nodes probe as CPU hosts on any machine (a GPU builder too): no accelerator tool on PATH
        env = {k: v for k, v in cpu_only_env().items() if not k.startswith(("PREBAKE_", "AWS_"))}
        env.update(aws, PREBAKE_HOME=str(root / "home"), PREBAKE_TRUSTED_KEYS="")
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket="fleet")
        with ray_cluster({**env, "PYTHONPATH": str(REPO)}) as cluster:
            for i in range(2):
                cluster.add_node({"prebake-cpu": 1}, env={"PREBAKE_HOME": str(root / f"node-cpu-{i}")})
            fake = {
                "PATH": f"{FAKE_HABANA / 'bin'}:{env['PATH']}",
                "PYTHONPATH": f"{REPO}:{FAKE_HABANA}",
                "PREBAKE_HOME": str(root / "node-gaudi3"),
            }
            # HPU given (as 0): Ray would otherwise import the stand-in habana_frameworks to count cards
            cluster.add_node({"prebake-gaudi3": 1, "HPU": 0}, env=fake)
            cluster.add_node({"prebake-gaudi2": 1}, env={"PREBAKE_HOME": str(root / "node-liar")})
            yield cluster, {**env, "PREBAKE_RECIPES": str(recipes)}, recipes


def _bake(cluster, env, model: str, registry: str, *extra: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    argv = [str(PREBAKE), "bake", "--model", model, "--executor", "ray", "--ray-address", cluster.address]
    argv += ["--registry", registry, *extra]
    return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _rows(stdout: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(target, kind) -> (outcome, node) from the driver's table."""
    rows = {}
    for line in stdout.splitlines()[1:]:
        m = re.match(
            r"(\S+)\s+(buckets|autotune|graphs)\s+(built|already present|failed|no matching node|unbuildable)\s+(\S+)",
            line,
        )
        if m:
            rows[(m[1], m[2])] = (m[3], m[4])
    return rows


def test_bakes_route_to_the_node_advertising_the_platform_and_a_mismatched_node_refuses(fleet, tmp_path):
    """The Gaudi3 target's keys, as the simulated Gaudi3 host computes them, are put in a folder
    registry first: the task finds them only if it ran there (and so compiles nothing)."""
    cluster, env, recipes = fleet
    registry = tmp_path / "registry"
    seed = (
        "import sys; from prebake.engine.common.probe import probe; from prebake.artifacts.recipe.kinds import target_keys; "
        "from prebake.engine.adapters import kinds_for; "
        "from prebake.artifacts.recipe.schema import load_recipe, targets; from tests.support.fleet import write_entry; "
        "r = load_recipe('fleet-gaudi'); t = [t for t in targets(r) if t.platform == 'gaudi3'][0]; "
        "[write_entry(__import__('pathlib').Path(sys.argv[1]), k) for k in target_keys(r, t, probe(), kinds_for(r, t)).keys.values()]"
    )
    fake = {**env, "PATH": f"{FAKE_HABANA / 'bin'}:{env['PATH']}", "PYTHONPATH": f"{REPO}:{FAKE_HABANA}"}
    subprocess.run([sys.executable, "-c", seed, str(registry)], env=fake, cwd=REPO, check=True, timeout=120)
    done = _bake(cluster, env, "fleet-gaudi", str(registry), "--node-timeout", "60", "--ray-retries", "0", timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out  # the gaudi2 target is refused
    rows = _rows(done.stdout)
    gaudi3 = [rows.get(("fleet-gaudi/gaudi3/tp1/bf16", k), ("?", "?")) for k in ("buckets", "autotune", "graphs")]
    assert [outcome for outcome, _ in gaudi3] == ["already present"] * 3, out  # keyed as a Gaudi3 host would
    assert gaudi3[1][1] != "-"  # decided on a node, not by the driver's plan
    assert "refused: this node is cpu" in out and "the target needs gaudi2" in out
    assert all(rows[("fleet-gaudi/gaudi2/tp1/bf16", k)][0] == "failed" for k in ("buckets", "autotune", "graphs"))


def test_a_target_no_node_can_build_is_reported_within_the_timeout(fleet):
    cluster, env, _ = fleet
    started = time.monotonic()
    done = _bake(cluster, env, "fleet-cuda", "s3://fleet/cuda", "--node-timeout", "5", timeout=300)
    assert done.returncode == 1
    assert all(outcome == "no matching node" for outcome, _ in _rows(done.stdout).values()), done.stdout
    assert "prebake-cuda-sm_90=1" in done.stdout and time.monotonic() - started < 240


@pytest.mark.slow
def test_two_cpu_nodes_bake_two_targets_once_into_s3_and_a_rerun_submits_nothing(fleet):
    cluster, env, _ = fleet
    registry = f"s3://fleet/{uuid.uuid4().hex[:8]}"
    first = _bake(cluster, env, "fleet-tiny", registry)
    assert first.returncode == 0, first.stdout + first.stderr
    rows = _rows(first.stdout)
    assert len(rows) == 6, first.stdout
    for dtype in ("bf16", "fp32"):
        assert rows[(f"fleet-tiny/cpu/tp1/{dtype}", "autotune")][0] == "built", first.stdout
        assert rows[(f"fleet-tiny/cpu/tp1/{dtype}", "graphs")][0] == "built", first.stdout
    # both targets share one buckets key (it depends on the serving limits only): one node built it,
    # the other found it, or lost the race to publish it
    buckets = sorted(rows[(f"fleet-tiny/cpu/tp1/{d}", "buckets")][0] for d in ("bf16", "fp32"))
    assert buckets == ["already present", "built"], first.stdout
    nodes = {rows[(f"fleet-tiny/cpu/tp1/{d}", "graphs")][1] for d in ("bf16", "fp32")}
    assert len(nodes) == 2, first.stdout  # one target per CPU node, in parallel
    assert all(re.fullmatch(r"[0-9a-f]{12}", n) for n in nodes), first.stdout  # Ray's node ids, not host:pid
    again = _bake(cluster, env, "fleet-tiny", registry)
    assert again.returncode == 0 and "0 Ray tasks submitted" in again.stdout, again.stdout
    verify = subprocess.run([str(PREBAKE), "verify", "--registry", registry], env=env, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.slow
def test_a_node_killed_mid_bake_leaves_no_partial_entry_and_the_target_is_reported(fleet):
    cluster, env, _ = fleet
    registry = f"s3://fleet/{uuid.uuid4().hex[:8]}"
    argv = [str(PREBAKE), "bake", "--model", "fleet-tiny", "--precision", "fp32", "--executor", "ray"]
    argv += ["--ray-address", cluster.address, "--registry", registry, "--ray-retries", "0", "--node-timeout", "30"]
    driver = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = _node_running_the_bake(cluster, timeout=600, needle=b"graphs-request.json")
    victim.kill()  # in the middle of compiling the graphs (whatever came before may be published)
    out, err = driver.communicate(timeout=600)
    assert driver.returncode == 1, out + err
    rows = _rows(out)
    assert rows[("fleet-tiny/cpu/tp1/fp32", "graphs")][0] == "failed", out
    verify = subprocess.run([str(PREBAKE), "verify", "--registry", registry], env=env, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr  # whatever is there is whole
    ls = subprocess.run([str(PREBAKE), "ls", "--registry", registry], env=env, capture_output=True, text=True)
    assert "graphs" not in ls.stdout


def _node_running_the_bake(cluster, timeout: float, needle: bytes = b"--target"):
    """The node whose process group holds an ancestor (its raylet) of the `prebake.engine.cli bake` child
    of a Ray task (Ray starts its workers in process groups of their own), once a process of the
    bake whose command line holds `needle` runs (the graphs build child: b"graphs-request.json")."""
    deadline = time.monotonic() + timeout
    groups = {node.proc.pid: node for node in cluster.nodes}
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(needle in part for part in cmd) and (
                b"prebake.engine.cli" in cmd or b"prebake.engine.bundled.build" in cmd
            ):
                node = _ancestor_node(int(pid), groups)
                if node is not None:
                    return node
        time.sleep(0.5)
    raise AssertionError("no Ray node started the bake")


def _ancestor_node(pid: int, groups: dict):
    while pid > 1:
        try:
            if os.getpgid(pid) in groups:
                return groups[os.getpgid(pid)]
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ProcessLookupError, ValueError):
            return None
    return None
