"""The vLLM start-up path records its misses, with their reasons, in the store's stats."""

import json

from prebake.artifacts.ports.errors import RegistryUnavailable
from prebake.artifacts.recipe.schema import Recipe, load_recipe
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.stats.ledger import read_stats
from prebake.engine.common.adapter import StartRequest
from prebake.engine.compose import Context
from prebake.engine.vllm.start import prepare
from tests.support.recipe_files import write_recipe
from tests.support.vllm_hosts import vllm_cpu_host


class _DownRegistry:
    url = "s3://down"

    def lookup(self, kind, key_digest):
        raise RegistryUnavailable("s3://down answered 503; retry later")


def _folder_recipe(tmp_path) -> Recipe:
    recipe = load_recipe("tiny-llama-vllm")
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "config.json").write_text(json.dumps(recipe.model.config))
    data = recipe.model_dump(mode="json")
    data["model"]["weights"] = str(tmp_path / "weights")
    return Recipe.model_validate(data)


def test_a_vllm_start_whose_registry_is_down_records_a_miss_per_kind(tmp_path, monkeypatch):
    monkeypatch.delenv("PREBAKE_STATS", raising=False)
    write_recipe(_folder_recipe(tmp_path), tmp_path / "recipes")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "recipes"))
    store = Store(tmp_path / "home")
    down = _DownRegistry()
    prepared = prepare(
        StartRequest(model="tiny-llama-vllm", engine="vllm", registry_timeout=5, fetch_timeout=5),
        Context(store, vllm_cpu_host(tmp_path / "host"), down.url, given_registry=down),
    )
    assert len(prepared.misses) == 3
    report = read_stats(store).to_json()
    assert report["total"]["misses"] == 3 and set(report["kinds"]) == {"buckets", "autotune", "graphs"}
    [reason] = report["miss_reasons"]
    assert reason["reason"] == "registry-down" and "503" in reason["example"]
