"""The bounded store: least recently used bundles go first, held trees never, crashed runs' leftovers are swept."""

import json
import threading
import time
from pathlib import Path

import pytest

from prebake.artifacts import fsutil
from prebake.artifacts.errors import StoreBoundError, StoreError, UnsafeArchiveError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.store.eviction import GcReport
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.mark import record_install
from prebake.artifacts.store.settings import DEFAULT_MAX_BYTES, StoreLimits, parse_size
from prebake.engine.cli import main
from prebake.registry.backends.file import FileRegistry
from tests.support.bundles import Bundle, make_bundle, tampered

PAYLOAD = 64 * 1024  # incompressible: each bundle is about 2 x 64 KiB in the store (blob + tree)


@pytest.fixture
def registry(tmp_path) -> FileRegistry:
    return FileRegistry(tmp_path / "registry")


def _published(tmp_path: Path, registry: FileRegistry, *models: str, payload: int = PAYLOAD) -> list[Bundle]:
    bundles = [make_bundle(tmp_path / "bake", model=m, payload_bytes=payload) for m in models]
    for b in bundles:
        registry.publish(b.manifest, b.blob)
    return bundles


def _fetch(store: Store, registry: FileRegistry, bundle: Bundle):
    got = fetch_key(store, registry, bundle.manifest.the_key())
    assert not isinstance(got, Miss), got
    return got


def _unbounded(home: Path) -> Store:
    return Store(home, StoreLimits())


def _store_bytes(store: Store) -> int:
    return sum(p.lstat().st_size for sub in ("blobs", "trees") for p in (store.home / sub).rglob("*") if not p.is_dir())


# -- sizes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"), [("5000", 5000), ("10M", 10 << 20), ("2g", 2 << 30), ("1.5GiB", 3 << 29), ("64 KB", 64 << 10)]
)
def test_sizes_read_as_bytes_with_binary_suffixes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "ten", "10X", "-5", "1e9"])
def test_a_size_that_is_not_one_says_how_to_write_it(text):
    with pytest.raises(StoreError, match="e.g. 10G"):
        parse_size(text, "--max-size")


def test_limits_come_from_the_environment():
    limits = StoreLimits.from_env({"PREBAKE_STORE_MAX_BYTES": "3M", "PREBAKE_UNPACK_MAX_BYTES": "1K"})
    assert limits.max_bytes == 3 << 20 and limits.unpack.max_bytes == 1024
    assert StoreLimits.from_env({}).max_bytes == DEFAULT_MAX_BYTES == 10 << 30  # sccache's default bound


def test_the_unpack_cap_from_the_environment_refuses_a_bundle_that_unpacks_past_it(tmp_path, registry):
    (bundle,) = _published(tmp_path, registry, "big")
    store = Store(tmp_path / "home", StoreLimits.from_env({"PREBAKE_UNPACK_MAX_BYTES": "10K"}))
    with pytest.raises(UnsafeArchiveError, match="over the cap of 10240"):
        fetch_key(store, registry, bundle.manifest.the_key())
    assert store.lookup("graphs", bundle.manifest.key_digest) is None


# -- eviction order ----------------------------------------------------------------------------


def test_gc_evicts_the_least_recently_used_bundle_first(tmp_path, registry):
    a, b, c = _published(tmp_path, registry, "a", "b", "c")
    store = _unbounded(tmp_path / "home")
    for bundle in (a, b, c):
        _fetch(store, registry, bundle)
    assert store.lookup("graphs", a.manifest.key_digest) is not None  # a is now the most recently used
    one_bundle = _store_bytes(store) // 3

    report = store.gc(2 * one_bundle + one_bundle // 2)

    assert report.evicted == (b.manifest.blob.hex,)
    assert store.lookup("graphs", b.manifest.key_digest) is None
    assert not store.blob_path(b.manifest.blob.digest).exists()
    assert not (store.home / "index" / "graphs" / f"{b.manifest.key_digest}.json").exists()
    assert store.lookup("graphs", a.manifest.key_digest) and store.lookup("graphs", c.manifest.key_digest)
    assert report.after_bytes == _store_bytes(store) <= report.max_bytes


def test_an_evicted_bundle_is_fetched_again_on_demand(tmp_path, registry):
    (a,) = _published(tmp_path, registry, "a")
    store = _unbounded(tmp_path / "home")
    _fetch(store, registry, a)
    store.gc(0)
    again = _fetch(store, registry, a)
    assert (again.tree / "kernels.bin").stat().st_size == PAYLOAD


def test_orphan_blobs_and_trees_count_and_go(tmp_path, registry):
    a, b = _published(tmp_path, registry, "a", "b")
    store = _unbounded(tmp_path / "home")
    tree_only, blob_only = _fetch(store, registry, a), _fetch(store, registry, b)
    store.blob_path(a.manifest.blob.digest).unlink()
    for index in (store.home / "index").rglob("*.json"):
        index.unlink()
    report = store.gc(0)
    assert set(report.evicted) == {a.manifest.blob.hex, b.manifest.blob.hex}
    assert not tree_only.tree.exists() and not blob_only.tree.exists()
    assert _store_bytes(store) == 0


def test_the_bound_from_the_environment_holds_after_every_install_but_spares_the_new_bundle(tmp_path, registry):
    a, b, c = _published(tmp_path, registry, "a", "b", "c")
    store = Store(tmp_path / "home", StoreLimits(max_bytes=3 * PAYLOAD))  # room for one bundle and a half
    for bundle in (a, b, c):
        _fetch(store, registry, bundle)
        assert _store_bytes(store) <= 3 * PAYLOAD
    assert [store.lookup("graphs", x.manifest.key_digest) is not None for x in (a, b, c)] == [False, False, True]

    tiny = Store(tmp_path / "home", StoreLimits(max_bytes=1))  # smaller than any bundle: refused, nothing evicted
    with pytest.raises(StoreBoundError, match="bounded to 0.0 MiB.*nothing was installed or evicted"):
        _fetch(tiny, registry, a)
    assert store.lookup("graphs", c.manifest.key_digest) is not None


def test_the_embedded_registry_is_never_evicted(tmp_path):
    store = _unbounded(tmp_path / "home")
    embedded = FileRegistry(store.default_registry)
    (a,) = _published(tmp_path, embedded, "a")
    _fetch(store, embedded, a)
    store.gc(0)
    assert embedded.lookup("graphs", a.manifest.key_digest) is not None
    assert embedded.blob_path(a.manifest.blob.digest).exists()


# -- in use ------------------------------------------------------------------------------------


def test_a_held_tree_is_never_evicted_and_goes_once_released(tmp_path, registry):
    a, b = _published(tmp_path, registry, "a", "b")
    store = _unbounded(tmp_path / "home")
    held, other = _fetch(store, registry, a), _fetch(store, registry, b)
    with store.use(held):
        report = store.gc(0)
        assert report.evicted == (other.manifest.blob.hex,) and report.in_use == (held.manifest.blob.hex,)
        assert store.lookup("graphs", a.manifest.key_digest) == held
        assert "still above the bound" in report.render()
    assert store.gc(0).evicted == (held.manifest.blob.hex,)


def test_holding_a_tree_evicted_since_it_was_fetched_says_fetch_again(tmp_path, registry):
    (a,) = _published(tmp_path, registry, "a")
    store = _unbounded(tmp_path / "home")
    installed = _fetch(store, registry, a)
    store.gc(0)
    with pytest.raises(StoreError, match="was evicted before it could be held; fetch it again"):
        with store.use(installed):
            pass
    assert store.gc(0).recovered == 1, "the lease made by the late `use` is swept"
    assert not (store.home / "leases").exists() or not list((store.home / "leases").iterdir())


def test_using_a_tree_counts_as_a_use(tmp_path, registry):
    a, b = _published(tmp_path, registry, "a", "b")
    store = _unbounded(tmp_path / "home")
    first, _ = _fetch(store, registry, a), _fetch(store, registry, b)
    with store.use(first):
        pass
    assert store.gc(_store_bytes(store) - 1).evicted == (b.manifest.blob.hex,)


def test_only_trees_of_this_store_can_be_held(tmp_path, registry):
    (a,) = _published(tmp_path, registry, "a")
    installed = _fetch(_unbounded(tmp_path / "one"), registry, a)
    with pytest.raises(StoreError, match="not a tree of the store"), _unbounded(tmp_path / "two").use(installed):
        pass


# -- leftovers of crashed runs -----------------------------------------------------------------


def _leftovers(store: Store, hexd: str) -> tuple[Path, Path]:
    partial_tree = store.home / "trees" / f".{hexd}.abc123.partial"
    (partial_tree / "fxgraph").mkdir(parents=True)
    (partial_tree / "fxgraph" / "entry.txt").write_text("half")
    partial_blob = store.home / "blobs" / "sha256" / hexd[:2] / f".tmp-{hexd}.tar.zst.xyz"
    partial_blob.parent.mkdir(parents=True)
    partial_blob.write_bytes(b"half a download")
    return partial_tree, partial_blob


def test_partial_trees_and_downloads_of_a_dead_install_are_swept_by_the_next_install(tmp_path, registry):
    (a,) = _published(tmp_path, registry, "a")
    store = _unbounded(tmp_path / "home")
    partial_tree, partial_blob = _leftovers(store, a.manifest.blob.hex)
    _fetch(store, registry, a)
    assert not partial_tree.exists() and not partial_blob.exists()


def test_gc_leaves_the_partial_files_of_a_live_install_alone(tmp_path, registry):
    store = _unbounded(tmp_path / "home")
    hexd = "ab" * 32
    record_install(store.home, hexd)  # an install records its blob before the first byte lands
    partial_tree, partial_blob = _leftovers(store, hexd)
    with fsutil.Flock.acquire(store.home / "locks" / f"{hexd}.lock"):  # an install in progress holds this
        assert store.recover() == 0
        assert partial_tree.exists() and partial_blob.exists()
    assert store.recover() == 3  # the two partials, and the install's record (no tree or blob of it left)
    assert not (store.home / "installs" / hexd).exists()
    assert not partial_tree.exists() and not partial_blob.exists()


def test_a_dead_processs_scratch_folder_goes_and_a_live_one_stays(tmp_path):
    store = _unbounded(tmp_path / "home")
    live = store.scratch("bake-live")
    (live / "payload").write_bytes(b"x")
    dead = store.home / "tmp" / "bake-dead"  # its owner was killed: nobody holds its lock
    dead.mkdir()
    (store.home / "locks" / "scratch-bake-dead.lock").touch()  # `scratch` took it; the kernel dropped the flock
    foreign = store.home / "tmp" / "someone-elses"  # no scratch lock: the store never made it
    foreign.mkdir()
    evicted = store.home / "tmp" / ".evicted-cafe-1"  # a gc was killed before deleting it
    evicted.mkdir()
    assert store.recover() == 2
    assert live.is_dir() and not dead.exists() and not evicted.exists() and foreign.is_dir()
    with pytest.raises(StoreError, match="in use by another build"):
        Store(store.home, StoreLimits()).scratch("bake-live")


def test_a_scratch_name_is_free_again_once_its_folder_is_gone(tmp_path):
    store = _unbounded(tmp_path / "home")
    first = store.scratch("bake-x")
    first.rmdir()
    assert store.scratch("bake-y").is_dir()  # releases bake-x on the way
    assert Store(store.home, StoreLimits()).scratch("bake-x").is_dir()


def test_index_entries_naming_a_missing_tree_are_misses_and_gc_drops_them(tmp_path, registry):
    a, b = _published(tmp_path, registry, "a", "b")
    store = _unbounded(tmp_path / "home")
    gone, kept = _fetch(store, registry, a), _fetch(store, registry, b)
    tampered(gone.tree).rename(store.home / "elsewhere")  # deleted by hand, say
    unreadable = store.home / "index" / "graphs" / f"{'cd' * 32}.json"
    unreadable.write_text("{not json")
    assert store.lookup("graphs", a.manifest.key_digest) is None
    report = store.gc(1 << 40)
    assert report.recovered == 3 and report.evicted == ()  # the dangling entry, the unreadable one, the tree's lease
    assert (store.home / "quarantine" / "index" / "graphs" / unreadable.name).read_text() == "{not json"  # kept aside
    assert sorted(p.name for p in (store.home / "index" / "graphs").iterdir()) == [f"{b.manifest.key_digest}.json"]
    assert store.lookup("graphs", b.manifest.key_digest) == kept


# -- locks -------------------------------------------------------------------------------------


def test_a_lock_deleted_by_its_holder_is_never_held_twice(tmp_path):
    path = tmp_path / "locks" / "x.lock"
    first = fsutil.Flock.acquire(path)
    got: list[fsutil.Flock] = []
    waiter = threading.Thread(target=lambda: got.append(fsutil.Flock.acquire(path)))
    waiter.start()
    time.sleep(0.2)  # the waiter has opened the old file and blocks on it
    first.release(unlink=True)
    waiter.join(5)
    assert got and path.exists(), "the waiter retried on a fresh file"
    assert fsutil.Flock.acquire(path, wait=False) is None, "the waiter's lock is the one at the path"
    got[0].release()
    assert fsutil.Flock.acquire(path, wait=False) is not None


def test_a_shared_lock_admits_readers_and_keeps_out_a_writer(tmp_path):
    path = tmp_path / "lease"
    readers = [fsutil.Flock.acquire(path, shared=True, wait=False) for _ in range(3)]
    assert all(readers)
    assert fsutil.Flock.acquire(path, wait=False) is None
    for r in readers:
        r.release()
    assert fsutil.Flock.acquire(path, wait=False) is not None


# -- the command -------------------------------------------------------------------------------


def test_prebake_gc_evicts_down_to_max_size_and_prints_what_it_did(tmp_path, registry, monkeypatch, capsys):
    a, b = _published(tmp_path, registry, "a", "b")
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREBAKE_STORE_MAX_BYTES", raising=False)
    store = Store()
    _fetch(store, registry, a)
    _fetch(store, registry, b)
    assert main(["gc", "--max-size", "200K"]) == 0
    out = capsys.readouterr().out
    assert "1 bundle(s) evicted" in out and f"evicted {a.manifest.blob.hex[:16]}" in out
    assert _store_bytes(store) <= 200 << 10


def test_prebake_store_gc_without_a_size_uses_the_default_bound(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREBAKE_STORE_MAX_BYTES", raising=False)
    assert main(["store", "gc", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_bytes"] == DEFAULT_MAX_BYTES
    monkeypatch.setenv("PREBAKE_STORE_MAX_BYTES", "2G")
    assert main(["store", "gc", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_bytes"] == 2 << 30


def test_the_old_spelling_prebake_gc_still_works_and_says_where_it_moved(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    assert main(["gc", "--dry-run"]) == 0
    assert "`prebake gc` is now `prebake store gc`" in capsys.readouterr().err


def test_store_stats_shows_the_store_size_and_its_bound(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PREBAKE_STORE_MAX_BYTES", "3G")
    assert main(["store", "stats"]) == 0
    assert "store size 0 B (bound 3.0 GiB" in capsys.readouterr().out
    assert main(["store", "stats", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["store_bytes"] == 0 and data["max_bytes"] == 3 << 30


def test_a_report_is_plain_data():
    report = GcReport(max_bytes=10, before_bytes=20, after_bytes=5, evicted=("ab" * 32,), in_use=(), recovered=0)
    assert "1 bundle(s) evicted, 0 kept because in use" in report.render()
    assert "still above" not in report.render()
