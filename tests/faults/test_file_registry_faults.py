"""A folder registry that is missing, unreadable, truncated, wrong or full: fetch misses or raises
a RegistryError that says what to do, never installs bad bytes; publish fails loudly and
leaves the registry exactly as it was. Every bundle is signed and fetched under the policy in force
(tests/faults/in_force.py); a forged file list is signed too, so the unpacker is what refuses it."""

from __future__ import annotations

import hashlib

import pytest

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryError, RegistryUnavailable
from prebake.registry.backends.file import FileRegistry
from tests.faults.procs import actor, result, unbounded


def _nothing_installed(store, manifest: Manifest) -> None:
    assert store.lookup(manifest.kind, manifest.key_digest) is None
    assert not store.tree_path(manifest).exists()
    assert not list(store.home.glob("blobs/**/*.tar.zst*")), "no blob, whole or partial, stays in the store"


def _snapshot(root) -> dict[str, str]:
    """Every file under a registry with the hash of its bytes."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_missing_registry_folder_is_a_miss(tmp_path, in_force, scenario):
    store = unbounded(scenario.store(tmp_path / "home"))
    bundle = in_force.bundle(tmp_path / "bake")
    got = in_force.fetch(store, FileRegistry(tmp_path / "nowhere"), bundle.manifest.the_key())
    assert isinstance(got, Miss) and "no bundle for this key" in got.reason
    _nothing_installed(store, bundle.manifest)


@pytest.mark.parametrize("damage", ["root-is-a-file", "entry-is-a-folder"])
def test_an_unreadable_registry_is_an_outage_that_says_what_to_check(tmp_path, in_force, scenario, damage):
    store = unbounded(scenario.store(tmp_path / "home"))
    bundle = in_force.bundle(tmp_path / "bake")
    root = tmp_path / "registry"
    if damage == "root-is-a-file":
        root.write_text("a mount that went wrong")
    else:
        (root / "index" / "graphs" / f"{bundle.manifest.key_digest}.json").mkdir(parents=True)
    with pytest.raises(RegistryUnavailable, match="cannot read .*check the folder's permissions"):
        in_force.fetch(store, FileRegistry(root), bundle.manifest.the_key())
    _nothing_installed(store, bundle.manifest)


@pytest.mark.parametrize("damage", ["truncated", "wrong-bytes", "missing"])
def test_a_damaged_blob_is_refused_and_nothing_is_installed(tmp_path, in_force, published, scenario, damage):
    registry, bundle = published
    blob = registry.blob_path(bundle.manifest.blob.digest)
    data = blob.read_bytes()
    if damage == "truncated":
        blob.write_bytes(data[: len(data) // 2])
    elif damage == "wrong-bytes":
        blob.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        blob.unlink()
    store = unbounded(scenario.store(tmp_path / "home"))
    expected = {"missing": (RegistryError, "run `prebake verify`")}.get(damage, (BlobDigestMismatch, "it is corrupt"))
    with pytest.raises(expected[0], match=expected[1]):
        in_force.fetch(store, registry, bundle.manifest.the_key())
    _nothing_installed(store, bundle.manifest)
    blob.write_bytes(data)  # repaired: the scenario's own re-verification finds the registry whole


def test_a_manifest_whose_file_list_lies_about_its_blob_installs_nothing(tmp_path, in_force, scenario):
    registry = FileRegistry(tmp_path / "registry")
    honest, other = in_force.bundle(tmp_path / "bake"), in_force.bundle(tmp_path / "bake", build="other")
    liar = in_force.sign(honest.manifest.model_copy(update={"blob": other.manifest.blob}))  # real blob, another's files
    registry.publish(liar, other.blob)
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(BundleError, match="does not match its manifest"):
        in_force.fetch(store, registry, honest.manifest.the_key())
    _nothing_installed(store, liar)


def test_publishing_into_a_broken_registry_fails_loudly_and_changes_nothing(tmp_path, in_force, published, scenario):
    registry, _ = published
    broken = FileRegistry(tmp_path / "broken")
    (broken.root / "index").mkdir(parents=True)
    (broken.root / "blobs").write_text("blobs/ should be a folder")
    before = _snapshot(broken.root)
    bundle = in_force.bundle(tmp_path / "bake", model="other")
    with pytest.raises(RegistryError, match="cannot publish into .*free space or fix permissions"):
        broken.publish(bundle.manifest, bundle.blob)
    assert _snapshot(broken.root) == before


def test_a_disk_that_fills_up_mid_publish_fails_the_publish_and_leaves_the_registry_as_it_was(
    tmp_path, in_force, published, scenario
):
    registry, first = published
    before = _snapshot(registry.root)
    bundle = in_force.bundle(tmp_path / "bake", model="big", payload_bytes=512 << 10)
    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(bundle.manifest.to_bytes())

    got = result(
        actor(
            "publish",
            "--home",
            str(tmp_path / "home"),
            "--registry",
            str(registry.root),
            "--manifest",
            str(manifest),
            "--blob",
            str(bundle.blob),
            "--fsize-limit",
            str(128 << 10),
        )
    )

    assert got["error"] == "RegistryError" and "File too large" in got["message"] and "free space" in got["message"]
    assert _snapshot(registry.root) == before, "no entry, no blob, no temporary: the registry is as it was"
    assert registry.lookup("graphs", bundle.manifest.key_digest) is None
    assert registry.publish(bundle.manifest, bundle.blob).created is True, "with room again, the same publish works"
    scenario.registry(registry, first.manifest, bundle.manifest)
