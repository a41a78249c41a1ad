"""The local store and fetch: verified installs, explained misses, nothing partial."""

import os
from pathlib import Path

import pytest

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.errors import BundleError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.keys import Key
from prebake.artifacts.store.local import Store
from prebake.registry.backends.file import FileRegistry

FACTORS = {"software": {"torch": "2.13.0+cpu"}, "precision": {"dtype": "bf16"}}


def _bundle(tmp_path: Path, key: Key, content: bytes = b"graphs") -> tuple[Manifest, Path]:
    tree = tmp_path / f"tree-{key.digest[:8]}-{len(content)}"
    (tree / "inductor").mkdir(parents=True)
    (tree / "inductor" / "entry").write_bytes(content)
    packed = pack(tree, tmp_path / f"{key.digest[:8]}-{len(content)}.tar.zst")
    manifest = Manifest(
        kind=key.kind,
        key=key.to_json()["groups"],
        key_digest=key.digest,
        blob=packed.blob,
        files=packed.files,
        created="2026-11-29T00:00:00+00:00",
        builder="test",
    )
    return manifest, tmp_path / f"{key.digest[:8]}-{len(content)}.tar.zst"


@pytest.fixture
def published(tmp_path):
    registry = FileRegistry(tmp_path / "registry")
    key = Key.of("graphs", FACTORS)
    manifest, blob = _bundle(tmp_path, key)
    registry.publish(manifest, blob)
    return registry, key, manifest


def test_fetch_installs_a_verified_tree(tmp_path, published):
    registry, key, manifest = published
    store = Store(tmp_path / "home")
    got = fetch_key(store, registry, key)
    assert not isinstance(got, Miss)
    assert (got.tree / "inductor" / "entry").read_bytes() == b"graphs"
    assert store.lookup("graphs", key.digest).tree == got.tree


def test_second_fetch_is_served_from_the_store_without_the_registry(tmp_path, published):
    registry, key, _ = published
    store = Store(tmp_path / "home")
    first = fetch_key(store, registry, key)
    gone = FileRegistry(tmp_path / "nowhere")
    assert fetch_key(store, gone, key).tree == first.tree


def test_a_miss_names_the_nearest_bundle_and_each_differing_factor(tmp_path, published):
    registry, _, _ = published
    wanted = Key.of("graphs", {**FACTORS, "software": {"torch": "2.14.1"}})
    got = fetch_key(Store(tmp_path / "home"), registry, wanted)
    assert isinstance(got, Miss)
    assert got.differing == {"software.torch": ("2.14.1", "2.13.0+cpu")}
    assert "software.torch: 2.14.1 here, 2.13.0+cpu there" in got.explain()


def test_an_empty_registry_is_a_plain_miss(tmp_path):
    got = fetch_key(Store(tmp_path / "home"), FileRegistry(tmp_path / "empty"), Key.of("graphs", FACTORS))
    assert isinstance(got, Miss) and got.nearest is None


def test_a_corrupt_blob_is_refused_and_nothing_is_installed(tmp_path, published):
    registry, key, manifest = published
    blob = registry.blob_path(manifest.blob.digest)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    store = Store(tmp_path / "home")
    with pytest.raises(BundleError):  # BlobDigestMismatch, or the unpacker's refusal if it saw the damage first
        fetch_key(store, registry, key)
    assert store.lookup("graphs", key.digest) is None
    assert not store.tree_path(manifest).exists()
    assert not list(store.home.rglob("*.tar.zst*")), "a rejected blob must not stay in the store"


def test_an_index_entry_edited_after_baking_is_refused(tmp_path, published):
    registry, key, manifest = published
    index = registry.root / "index" / "graphs" / f"{key.digest}.json"
    index.write_text(index.read_text().replace("2.13.0+cpu", "2.14.1"))
    with pytest.raises(BundleError, match="edited after baking"):
        fetch_key(Store(tmp_path / "home"), registry, key)


def test_a_trust_check_refusal_is_a_miss_with_its_reason(tmp_path, published):
    registry, key, _ = published
    got = fetch_key(Store(tmp_path / "home"), registry, key, trust=lambda m: "unsigned")
    assert isinstance(got, Miss) and got.reason == "refused by the trust policy: unsigned"


def test_republishing_the_same_bundle_is_a_no_op_and_a_different_one_is_refused(tmp_path, published):
    from prebake.artifacts.ports.errors import PublishConflict

    registry, key, manifest = published
    again = registry.publish(manifest, registry.blob_path(manifest.blob.digest))
    assert again.created is False
    other, blob = _bundle(tmp_path, key, content=b"another build")
    with pytest.raises(PublishConflict, match="keeps the first one"):
        registry.publish(other, blob)
    assert registry.lookup("graphs", key.digest).blob == manifest.blob


def test_registry_address_prefers_explicit_then_env_then_embedded(tmp_path):
    store = Store(tmp_path / "home")
    assert store.registry_address("s3://b/p", env={"PREBAKE_REGISTRY": "/x"}) == "s3://b/p"
    assert store.registry_address(None, env={"PREBAKE_REGISTRY": "/x"}) == "/x"
    assert store.registry_address(None, env={}) == str(tmp_path / "home" / "registry")


def test_default_home_honours_prebake_home(monkeypatch, tmp_path):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "h"))
    assert Store().home == tmp_path / "h"
    monkeypatch.delenv("PREBAKE_HOME")
    assert Store().home == Path(os.path.expanduser("~")) / ".cache" / "prebake"


def test_publish_sweeps_temporaries_left_by_killed_bakers(tmp_path):
    registry = FileRegistry(tmp_path / "registry")
    manifest, blob = _bundle(tmp_path, Key.of("graphs", FACTORS))
    folder = registry.blob_path(manifest.blob.digest).parent
    folder.mkdir(parents=True)
    stale, fresh = folder / ".tmp-dead.tar.zst.abc", folder / ".tmp-live.tar.zst.def"
    stale.write_bytes(b"half a blob")
    fresh.write_bytes(b"a blob being written right now")
    os.utime(stale, (0, 0))
    registry.publish(manifest, blob)
    assert not stale.exists(), "a temporary older than the grace period is a dead writer's"
    assert fresh.exists(), "a young temporary may belong to a live writer"
