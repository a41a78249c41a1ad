"""--json everywhere: ls, verify and fetch print stable shapes; a fetch's misses land in the store's stats."""

import json

import pytest

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.recipe.schema import load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine.cli import main
from prebake.engine.compose import Context
from prebake.registry.backends.file import FileRegistry
from tests.support.bundles import make_bundle


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PREBAKE_REGISTRY", str(tmp_path / "registry"))
    monkeypatch.delenv("PREBAKE_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("PREBAKE_STATS", raising=False)
    (tmp_path / "registry").mkdir()  # an empty registry; a folder that is not there is an error
    return FileRegistry(tmp_path / "registry")


def test_ls_json_lists_each_bundle_with_its_key_blob_and_labels(tmp_path, env, capsys):
    bundle = make_bundle(tmp_path / "bake")
    env.publish(bundle.manifest.model_copy(update={"build_seconds": 3.0}), bundle.blob)
    assert main(["ls", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["registry"] == env.url
    [row] = data["bundles"]
    assert row["key"] == bundle.manifest.key_digest and row["blob"] == bundle.manifest.blob.digest
    assert row["model"] == "tiny-llama" and row["build_seconds"] == 3.0 and row["signers"] == []
    assert set(row) == {
        "kind",
        "key",
        "model",
        "labels",
        "blob",
        "bytes",
        "created",
        "builder",
        "build_seconds",
        "signers",
    }


def test_verify_json_reports_a_damaged_blob_as_a_finding(tmp_path, env, capsys):
    bundle = make_bundle(tmp_path / "bake")
    env.publish(bundle.manifest, bundle.blob)
    assert main(["verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bad"] == 0
    blob = env.root / "blobs" / "sha256" / bundle.manifest.blob.hex[:2] / f"{bundle.manifest.blob.hex}.tar.zst"
    blob.write_bytes(b"not the bundle")
    assert main(["verify", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"registry", "entries", "ok", "bad", "findings", "notes"}
    [finding] = data["findings"]
    assert finding["key_digest"] == bundle.manifest.key_digest and finding["kind"] == "graphs"


def test_fetch_json_on_a_miss_names_every_miss_and_records_them_in_stats(env, capsys):
    assert main(["fetch", "--model", "tiny-llama", "--precision", "fp32", "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["complete"] is False and data["target"]
    assert {m["kind"] for m in data["misses"]} == {"buckets", "autotune", "graphs"}
    assert {m["reason_class"] for m in data["misses"]} == {"no-bundle"}
    assert set(data["misses"][0]) == {
        "kind",
        "key",
        "reason",
        "reason_class",
        "refused",
        "unavailable",
        "nearest",
        "differing",
    }
    assert not any(m["refused"] for m in data["misses"])  # nothing was there: a miss, exit 3
    assert main(["stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["total"]["misses"] == 3 and stats["total"]["hits"] == 0
    assert Store().home.joinpath("stats", "events.jsonl").exists()


def _publish_plan(tmp_path, registry: FileRegistry, seconds: dict[str, float]) -> dict[str, Manifest]:
    """A bundle under each of tiny-llama fp32's keys on this host, each with a recorded build time."""
    context = Context.open(str(registry.root), store=Store())
    the_plan = context.pick_plan(load_recipe("tiny-llama"), dtype="fp32")
    published = {}
    for kind in the_plan.kinds.names:
        tree = tmp_path / "trees" / kind
        tree.mkdir(parents=True)
        for name in the_plan.kinds[kind].outputs:
            (tree / name).write_text(f"{kind} {name}\n")
        packed = pack(tree, tmp_path / f"{kind}.tar.zst")
        key = the_plan.key(kind)
        manifest = Manifest(
            kind=kind,
            key=key.to_json()["groups"],
            key_digest=key.digest,
            labels=the_plan.labels,
            blob=packed.blob,
            files=packed.files,
            created="2026-11-30T00:00:00+00:00",
            builder="test",
            build_seconds=seconds[kind],
        )
        registry.publish(manifest, tmp_path / f"{kind}.tar.zst")
        published[kind] = manifest
    return published


def test_fetch_hits_from_the_registry_then_the_store_count_bytes_and_seconds_saved(tmp_path, env, capsys):
    seconds = {"buckets": 0.5, "autotune": 40.0, "graphs": 90.0}
    published = _publish_plan(tmp_path, env, seconds)
    for _ in range(2):
        assert main(["fetch", "--model", "tiny-llama", "--precision", "fp32", "--json"]) == 0
        fetched = json.loads(capsys.readouterr().out)
        assert fetched["complete"] is True and fetched["misses"] == [] and set(fetched["bundles"]) == set(published)
    assert main(["stats", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for kind, manifest in published.items():
        tally = report["kinds"][kind]
        assert tally["registry_hits"] == 1 and tally["store_hits"] == 1 and tally["hit_rate"] == 1.0
        assert tally["bytes_fetched"] == manifest.blob.size and tally["seconds_saved"] == 2 * seconds[kind]
    assert report["total"]["seconds_saved"] == 2 * sum(seconds.values())
