"""vLLM on Gaudi without a Gaudi: the keys, environments and recipe-cache flow a Gaudi host would
produce, against the simulated habana stack in tests/support/fake_habana (a habana_frameworks
package with habana-torch-plugin metadata, and an hl-smi stand-in) and the vLLM stand-in."""

import json
import os
import subprocess
import sys

import pytest

from prebake.artifacts.bake.bake_kind import bake_kind
from prebake.artifacts.errors import BuildError
from prebake.artifacts.recipe.schema import Recipe, load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine.adapters import adapter_for
from prebake.engine.common.adapter import StartRequest
from prebake.engine.common.probe import probe
from prebake.engine.compose import Context, plans_for
from prebake.engine.vllm import gaudi
from prebake.engine.vllm.gaudi import vllm_gaudi_env
from prebake.engine.vllm.process import Spawn, start, stop, wait_ready
from prebake.engine.vllm.start import prepare
from prebake.registry import open_registry
from tests.support.baking import REPO
from tests.support.ports import free_port
from tests.support.recipe_files import write_recipe

FAKE = REPO / "tests" / "support" / "fake_habana"
STANDIN = REPO / "tests" / "support" / "vllm_standin.py"


def gaudi_env(product: str = "HL-325L", driver: str = "1.21.0-ca59b5a") -> dict[str, str]:
    return {
        "PATH": f"{FAKE / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "FAKE_HABANA_PRODUCT": product,
        "FAKE_HABANA_DRIVER": driver,
    }


def gaudi_host(product: str = "HL-325L", site: list[str] | None = None):
    return probe(env=gaudi_env(product), metadata_path=site or [str(FAKE), *sys.path])


def recipe_with(**changes) -> Recipe:
    data = load_recipe("tiny-llama-vllm").model_dump(mode="json")
    data["matrix"].update({"platform": ["gaudi2", "gaudi3"], "tp": [1, 2], "dtype": ["bf16", "fp8"]})
    for section, values in changes.items():
        data[section].update(values)
    return Recipe.model_validate(data)


def graphs_key(recipe: Recipe, host, *, tp: int = 1, dtype: str = "bf16"):
    return plans_for(recipe, host, tp=tp, dtype=dtype)[0].key("graphs")


# --- the host ---------------------------------------------------------------------------------


def test_simulated_habana_stack_probes_as_a_gaudi3_with_its_software_version():
    script = "from prebake.engine.common.probe import probe; import json; h = probe(); print(json.dumps(h.factors()))"
    env = {**os.environ, **gaudi_env(), "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}"}

    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    factors = json.loads(done.stdout)

    assert done.returncode == 0, done.stderr
    assert factors["platform"] == {"device": "gaudi", "arch": "gaudi3", "device_name": "HL-325L"}
    assert (factors["software"]["habana"], factors["software"]["driver"]) == ("1.21.0.555", "1.21.0-ca59b5a")


# --- keys: what invalidates a recipe cache --------------------------------------------------------


def test_graphs_key_changes_with_generation_software_tp_and_dtype(tmp_path):
    recipe = recipe_with()
    base = graphs_key(recipe, gaudi_host())
    older_stack = tmp_path / "site" / "habana_torch_plugin-1.20.1.97.dist-info"
    older_stack.mkdir(parents=True)
    (older_stack / "METADATA").write_text("Metadata-Version: 2.1\nName: habana-torch-plugin\nVersion: 1.20.1.97\n")

    assert graphs_key(recipe, gaudi_host("HL-225")).diff(base)["platform.arch"] == ("gaudi2", "gaudi3")
    assert graphs_key(recipe, gaudi_host(site=[str(tmp_path / "site"), *sys.path])).diff(base)["software.habana"] == (
        "1.20.1.97",
        "1.21.0.555",
    )
    assert graphs_key(recipe, gaudi_host(), tp=2).diff(base)["parallel.tp"] == ("2", "1")
    assert graphs_key(recipe, gaudi_host(), dtype="fp8").diff(base)["precision.dtype"] == ("fp8", "bf16")


def test_visible_modules_and_hostnames_leave_the_key_alone(monkeypatch):
    recipe = recipe_with()
    before = graphs_key(recipe, gaudi_host()).digest
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5")
    monkeypatch.setenv("HOSTNAME", "gaudi-node-17")

    assert (
        graphs_key(
            recipe, probe(env={**gaudi_env(), "HABANA_VISIBLE_MODULES": "4,5"}, metadata_path=[str(FAKE), *sys.path])
        ).digest
        == before
    )


# --- environments ---------------------------------------------------------------------------------


def test_bake_compiles_every_bucket_into_an_empty_recipe_folder_in_the_artifact(tmp_path):
    recipe = recipe_with()
    plan = plans_for(recipe, gaudi_host(), dtype="bf16", tp=1)[0]

    env = adapter_for(plan.recipe, plan.target).build_environment(plan, tmp_path / "tree", {"PATH": "/usr/bin"})

    assert env["PT_HPU_RECIPE_CACHE_CONFIG"] == f"{tmp_path / 'tree' / 'hpu-recipes'},True,8192"
    assert {k: env[k] for k in vllm_gaudi_env(recipe.serving, recipe.buckets)} == vllm_gaudi_env(
        recipe.serving, recipe.buckets
    )
    assert (env["VLLM_BUCKETING_STRATEGY"], env["VLLM_PROMPT_BS_BUCKET_MAX"]) == ("exp", "2")
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "tree" / "vllm-cache")


def test_linear_buckets_export_every_range_variable():
    recipe = recipe_with(buckets={"strategy": "linear"})

    variables = gaudi.bucket_variables(recipe)

    assert variables["VLLM_BUCKETING_STRATEGY"] == "lin"
    assert variables["VLLM_DECODE_BS_BUCKET_MAX"] == "2" and variables["VLLM_PROMPT_QUERY_BUCKET_MAX"] == "128"


def test_recipe_cache_value_round_trips_and_refuses_a_comma(tmp_path):
    value = gaudi.recipe_cache_config(tmp_path / "r", False, 8192)

    assert gaudi.parse_recipe_cache_config(value) == (tmp_path / "r", False, 8192)
    with pytest.raises(BuildError, match="comma"):
        gaudi.recipe_cache_config(tmp_path / "a,b", True, 8192)
    with pytest.raises(BuildError, match="<path>,<True|False>,<size MB>"):
        gaudi.parse_recipe_cache_config("/tmp/r,maybe,10")


def test_serving_size_never_evicts_what_was_baked(tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "big.recipe").write_bytes(b"\0" * (5 << 20))

    _, delete, size = gaudi.parse_recipe_cache_config(
        gaudi.hpu_variables(recipe_with(), folder)["PT_HPU_RECIPE_CACHE_CONFIG"]
    )

    assert delete is False and size == 8192
    assert gaudi.folder_mb(folder) == 5


def test_a_recipe_cache_on_nfs_is_reported(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/export {tmp_path / 'shared'} nfs4 rw 0 0\n")
    (tmp_path / "shared").mkdir()

    assert gaudi.local_disk_problem(tmp_path / "shared" / "cache", mounts).startswith(f"{tmp_path / 'shared'}")
    assert "nfs4" in gaudi.local_disk_problem(tmp_path / "shared" / "cache", mounts)
    assert gaudi.local_disk_problem(tmp_path / "local", mounts) is None


# --- bake on a (simulated) Gaudi, serve from a local copy of its recipes ------------------------------


def test_gaudi_bake_packs_the_recipes_and_a_server_reuses_a_local_copy(tmp_path, monkeypatch):
    """Plumbing, not reuse: the HPU recipes baked reach the server's private recipe folder with the
    bridge's settings. The hit lines counted are printed by the stand-in, under a reuse rule the
    stand-in itself implements (one recipe per bucket setting); whether the real bridge reuses them
    is checked only on Gaudi hardware (docs/verified.md)."""
    for name, value in {
        **gaudi_env(),
        "PREBAKE_VLLM_COMMAND": f"{sys.executable} {STANDIN}",
        "PYTHONPATH": f"{FAKE}{os.pathsep}{REPO}",
    }.items():
        monkeypatch.setenv(name, value)
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    recipe = recipe_with(model={"weights": str(weights)})
    write_recipe(recipe, tmp_path / "recipes")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "recipes"))
    host = gaudi_host()
    plan = plans_for(recipe, host, dtype="bf16", tp=1)[0]
    registry = open_registry(str(tmp_path / "registry"))

    for kind in ("buckets", "autotune", "graphs"):
        baked = bake_kind(plan, kind, store=Store(tmp_path / "baker"), registry=registry)
    recipes_baked = [f.path for f in baked.manifest.files if f.path.startswith("hpu-recipes/")]
    served = prepare(
        StartRequest(model="tiny-llama-vllm", engine="vllm", precision="bf16"),
        Context(Store(tmp_path / "server"), host, registry.url, given_registry=registry),
    )
    path, delete, _ = gaudi.parse_recipe_cache_config(served.variables["PT_HPU_RECIPE_CACHE_CONFIG"])
    log, port = tmp_path / "serve.log", free_port()
    running = start(Spawn((*served.argv, "--port", str(port)), served.child_env(dict(os.environ)), served.cwd, log))
    try:
        wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=60)
    finally:
        stop(running)

    assert len(recipes_baked) == 3 and served.misses == ()
    assert delete is False and path == served.cache_root / "hpu-recipes" and len(list(path.iterdir())) == 3
    assert log.read_text().count("HPU recipe cache hit") == 3 and "HPU recipe compiled" not in log.read_text()


def test_a_traffic_fitted_set_reaches_vllm_gaudi_as_its_bucket_file_and_reads_back_exactly(tmp_path):
    from prebake.artifacts.buckets.artifact import build_bucket_set
    from prebake.artifacts.recipe.kinds import BUCKETS_FILE
    from prebake.engine.vllm.gaudi_file import upstream_reading
    from tests.support.synthetic_traces import synthetic_requests, write_jsonl

    trace = write_jsonl(synthetic_requests("chat", 200, max_len=120), tmp_path / "fit.jsonl")
    recipe = recipe_with(buckets={"strategy": "traffic", "trace": str(trace), "budget": 9})
    baked = build_bucket_set(recipe.serving, recipe.buckets)
    buckets_tree = tmp_path / "buckets"
    buckets_tree.mkdir()
    (buckets_tree / BUCKETS_FILE).write_text(json.dumps(baked.to_json()))

    bake_env = gaudi.build_variables(recipe, tmp_path / "tree", buckets_tree)
    serve_env = gaudi.hpu_variables(recipe, tmp_path / "run" / gaudi.RECIPES_DIR, buckets_tree)

    for env in (bake_env, serve_env):
        text = open(env["VLLM_BUCKETING_FROM_FILE"]).read()
        prompt, decode = upstream_reading(text, recipe.serving)
        assert prompt == [(b.batch, b.query, b.ctx_blocks) for b in baked.prompt]
        assert decode == [(b.batch, b.query, b.ctx_blocks) for b in baked.decode]
