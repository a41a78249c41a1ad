"""--json everywhere: ls, verify and fetch print stable shapes; a fetch's misses land in the store's stats."""

import json

import pytest

from artifacts.store import Store
from engine.cli import main
from registry.file import FileRegistry
from tests.support.bundles import make_bundle


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PREBAKE_REGISTRY", str(tmp_path / "registry"))
    monkeypatch.delenv("PREBAKE_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("PREBAKE_STATS", raising=False)
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
    assert set(data["misses"][0]) == {"kind", "key", "reason", "reason_class", "nearest", "differing"}
    assert main(["stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["total"]["misses"] == 3 and stats["total"]["hits"] == 0
    assert Store().home.joinpath("stats", "events.jsonl").exists()
