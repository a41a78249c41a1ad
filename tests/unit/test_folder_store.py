"""The folder's object store (registry/backends/file.py): what it promises beyond the port's six methods."""

from __future__ import annotations

import os

import pytest

from prebake.artifacts.errors import BundleError
from prebake.artifacts.layout import index_relpath
from prebake.artifacts.ports.errors import RegistryError
from prebake.artifacts.ports.objects import Movable, ObjectStore
from prebake.registry.backends.file import FileRegistry, FolderStore
from tests.support.index_seed import seed_folder, synthetic_manifests


def test_quarantine_on_a_folder_is_a_rename_not_a_copy(tmp_path):
    manifest = synthetic_manifests(1, files=2)[0]
    seed_folder(tmp_path / "registry", [manifest])
    registry = FileRegistry(tmp_path / "registry")
    assert isinstance(registry.store, ObjectStore) and isinstance(registry.store, Movable)
    entry = tmp_path / "registry" / index_relpath(manifest.kind, manifest.key_digest)
    inode = entry.stat().st_ino
    moved = registry.quarantine(manifest.kind, manifest.key_digest)
    assert not entry.exists() and os.stat(moved).st_ino == inode  # the same file, renamed
    assert registry.lookup(manifest.kind, manifest.key_digest) is None


def test_list_is_in_key_order_without_temporaries_and_its_tags_change_with_the_bytes(tmp_path):
    store = FolderStore(tmp_path)
    for key in ("index/graphs/b.json", "index/graphs/a.json", "meta/x"):
        assert store.put(key, b"{}")
    (tmp_path / "index" / "graphs" / ".tmp-c.json.123").write_bytes(b"half")  # a writer killed mid-write
    listed = list(store.list("index/"))
    assert [s.key for s in listed] == ["index/graphs/a.json", "index/graphs/b.json"]
    assert store.put("index/graphs/a.json", b"{}", create_only=True) is False  # taken: nothing written
    store.put("index/graphs/a.json", b'{"a": 1}')
    assert store.head("index/graphs/a.json").tag != listed[0].tag


def test_reads_stay_inside_the_root_and_within_their_bound(tmp_path):
    store = FolderStore(tmp_path / "registry")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "e.json").write_bytes(b"{}")
    (tmp_path / "registry" / "index").mkdir(parents=True)
    (tmp_path / "registry" / "index" / "graphs").symlink_to(tmp_path / "outside")
    with pytest.raises(BundleError, match="outside"):
        store.get("index/graphs/e.json", 100)
    store.put("meta/big", b"x" * 101)
    with pytest.raises(BundleError, match="over the 100"):
        store.get("meta/big", 100)
    with pytest.raises(RegistryError, match="not a key inside"):
        store.get("../outside/e.json", 100)
