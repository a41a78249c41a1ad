"""Installed trees are read-only to the engines that read them (issue 49 item 9): no write bit on any
file or folder of a tree once installed, and the store still evicts, discards and recovers them.
Run as root (where permissions are not enforced) the modes are checked; run as another user
(tests/README.md: the store's tests under `runuser`), a write into a tree is refused for real."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.store import sealing
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.settings import StoreLimits
from prebake.engine.bundled.cache_layout import fetched_cache
from prebake.registry.backends.file import FileRegistry
from tests.support.bundles import make_bundle

WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def _installed(tmp_path: Path, model: str = "a"):
    registry = FileRegistry(tmp_path / "registry")
    bundle = make_bundle(tmp_path / "bake", model=model, payload_bytes=4096)
    registry.publish(bundle.manifest, bundle.blob)
    store = Store(tmp_path / "home", StoreLimits())
    got = fetch_key(store, registry, bundle.manifest.the_key())
    assert not isinstance(got, Miss), got
    return store, got


def _writable(tree: Path) -> list[str]:
    return [str(p) for p in [tree, *tree.rglob("*")] if not p.is_symlink() and p.lstat().st_mode & WRITE]


def test_an_installed_tree_has_no_write_bit_anywhere(tmp_path):
    store, got = _installed(tmp_path)
    assert list(got.tree.rglob("*")) and _writable(got.tree) == []
    if os.geteuid() != 0:  # root writes anyway: the modes above are what is enforced for everyone else
        with pytest.raises(PermissionError):
            (got.tree / "inductor").mkdir()
        with pytest.raises(PermissionError):
            (got.tree / "kernels.bin").write_bytes(b"changed")


def test_gc_evicts_a_sealed_tree_and_its_writable_cache(tmp_path):
    store, got = _installed(tmp_path)
    cache = fetched_cache(got, store.cache_path(got.manifest))
    (cache / "entry").write_text("written by a torch process started with fetch's exports")
    report = store.gc(0)
    assert report.evicted == (got.manifest.blob.hex,)
    assert not got.tree.exists() and not store.cache_path(got.manifest).exists()
    assert not any((store.home / "tmp").iterdir())  # the renamed tree was deleted, not left in tmp/


def test_the_fetched_cache_is_writable_seeded_from_the_tree_and_made_once(tmp_path):
    store, got = _installed(tmp_path)
    cache = fetched_cache(got, store.cache_path(got.manifest))
    assert cache.is_dir() and cache.name == "inductor" and os.access(cache, os.W_OK)
    assert not cache.is_relative_to(got.tree)
    (cache / "mine").write_text("x")
    assert fetched_cache(got, store.cache_path(got.manifest)) == cache and (cache / "mine").exists()


def test_a_sealed_tree_left_in_tmp_by_a_dead_gc_is_removed(tmp_path):
    folder = tmp_path / "tree"
    (folder / "a" / "b").mkdir(parents=True)
    (folder / "a" / "b" / "f").write_text("x")
    sealing.seal(folder)
    assert _writable(folder) == []
    sealing.remove(folder)
    assert not folder.exists()


def test_gc_removes_a_cache_whose_tree_is_gone(tmp_path):
    store, got = _installed(tmp_path)
    orphan = store.home / "caches" / ("ab" * 32) / "inductor"
    orphan.mkdir(parents=True)
    kept = fetched_cache(got, store.cache_path(got.manifest))
    store.gc(1 << 40)  # evicts nothing
    assert not orphan.parent.exists() and kept.is_dir()
