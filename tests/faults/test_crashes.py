"""kill -9 at every step that writes: readers find nothing or a whole verified bundle, never a
part of one, and the next run removes what the dead process left and succeeds.

Each crash is a real SIGKILL: PREBAKE_TEST_CRASH_AT makes the process kill itself at a named
point (artifacts/fsutil.py lists them), so the crash lands at the same step every run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from prebake.registry.backends.file import FileRegistry
from tests.faults.checks import store_problems
from tests.faults.procs import REPO, actor, child_env, killed, result, unbounded

CRASH = "PREBAKE_TEST_CRASH_AT"


def _fetch_args(home, registry, bundle) -> list[str]:
    return ["--home", str(home), "--registry", str(registry.root), "--key", bundle.manifest.key_digest]


@pytest.mark.parametrize(
    ("point", "leftover"),
    [
        ("write:*.tar.zst", "blobs/sha256/*/.tmp-*.tar.zst.*"),  # the download, complete but not yet renamed
        ("unpack", "trees/.*.partial"),  # every file extracted and checked, the tree not yet renamed
    ],
    ids=["download", "unpack"],
)
def test_kill_9_while_fetching_leaves_nothing_readable_and_the_next_fetch_cleans_up(
    tmp_path, published, scenario, point, leftover
):
    registry, bundle = published
    home = scenario.store(tmp_path / "home")
    killed(actor("fetch", *_fetch_args(home, registry, bundle), env={CRASH: point}))

    store = unbounded(home)
    assert list(home.glob(leftover)), f"the process died elsewhere than at {point}: no {leftover} left"
    assert store.lookup("graphs", bundle.manifest.key_digest) is None, "a reader must see nothing"
    assert not (home / "trees" / bundle.manifest.blob.hex).exists()
    assert store_problems(home) == []

    again = result(actor("fetch", *_fetch_args(home, registry, bundle)))
    assert again["problems"] == []
    assert not list(home.glob(leftover)), "the next fetch of the same blob removes the dead one's leftovers"


def test_kill_9_after_the_tree_but_before_its_index_entry_is_a_miss_then_a_cheap_reinstall(
    tmp_path, published, scenario
):
    registry, bundle = published
    home = scenario.store(tmp_path / "home")
    killed(actor("fetch", *_fetch_args(home, registry, bundle), env={CRASH: "write:*.json"}))

    store = unbounded(home)
    assert store.lookup("graphs", bundle.manifest.key_digest) is None
    temporaries = list(home.glob("index/graphs/.tmp-*"))
    assert temporaries, "the process died elsewhere than writing its index entry"

    count = tmp_path / "downloads.log"
    again = result(actor("fetch", *_fetch_args(home, registry, bundle), "--count", str(count)))
    assert again["problems"] == [] and not count.exists(), "the complete tree is reused, not downloaded again"
    for stale in temporaries:  # index temporaries name no blob, so they go by age: make them old
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
    assert store.gc(1 << 40).recovered >= len(temporaries)
    assert not list(home.glob("index/graphs/.tmp-*"))


@pytest.mark.parametrize(
    ("point", "registry_leftover"),
    [
        ("write:*.tar.zst", "blobs/sha256/*/.tmp-*"),  # copying the blob into the registry
        ("create:*.json", "blobs/sha256/*/*.tar.zst"),  # blob in place, index entry not yet created
    ],
    ids=["blob-upload", "index-create"],
)
def test_kill_9_while_publishing_leaves_the_registry_without_an_entry_and_the_next_bake_publishes(
    tmp_path, scenario, in_force, point, registry_leftover
):
    registry = FileRegistry(tmp_path / "registry")
    home = scenario.store(tmp_path / "home")
    bake = ["--home", str(home), "--registry", str(registry.root)]
    killed(actor("bake", *bake, env={CRASH: point}))

    assert list(registry.root.glob(registry_leftover)), f"the baker died elsewhere than at {point}"
    assert list(registry.list()) == [], "no index entry may exist without its whole blob"
    assert list((home / "tmp").iterdir()), "the dead baker's scratch folder is still there"
    from prebake.registry.review.verify import verify_registry

    assert verify_registry(registry, trust=in_force.trust(registry), quarantine=False).entries == 0

    baked = result(actor("bake", *bake))
    assert baked["created"] is True
    (entry,) = registry.list()
    assert entry.signatures and entry.signatures[0].signer == "fleet", "the baker signed under the policy"
    scenario.registry(registry, entry)
    assert list((home / "tmp").iterdir()) == [], "the next bake removed the dead baker's scratch folder"


def test_kill_9_while_evicting_leaves_a_miss_and_the_next_gc_finishes_the_job(tmp_path, published, scenario):
    registry, bundle = published
    home = scenario.store(tmp_path / "home")
    result(actor("fetch", *_fetch_args(home, registry, bundle)))
    env = child_env(PREBAKE_HOME=str(home))  # under the scenario's policy: its notion of in use
    gc = [sys.executable, "-m", "prebake.engine.cli", "gc", "--max-size", "0"]

    crashed = subprocess.run(gc, env={**env, CRASH: "evict"}, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert crashed.returncode == -9, crashed.stderr
    store = unbounded(home)
    assert store.lookup("graphs", bundle.manifest.key_digest) is None
    assert list((home / "tmp").glob(".evicted-*")), "the gc died elsewhere than mid-eviction"
    assert store_problems(home) == []

    finished = subprocess.run(gc, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0, finished.stderr
    # the leftovers: the tree the dead gc had moved into tmp/, and the lease it never got to delete
    assert "1 bundle(s) evicted" in finished.stdout and "2 leftover(s) of crashed runs removed" in finished.stdout
    assert list((home / "tmp").iterdir()) == [] and not list(home.glob("blobs/sha256/*/*"))
    assert result(actor("fetch", *_fetch_args(home, registry, bundle)))["problems"] == []
