"""The store deletes only what it made: a home that is a folder registry, a newer prebake's store or a
folder of someone's files loses nothing to any command, and inside a store only installed bundles go."""

from __future__ import annotations

import json
import shutil

import pytest

from prebake.artifacts.store.mark import INSTALLS, MARK, STORE_VERSION, release
from prebake.registry.backends.file import FileRegistry
from tests.operations.target import fetch_args, prebake, prebake_env, published_set
from tests.support.bundles import make_bundle

EXIT_STORE = 5
DELETING = (
    ["store", "gc", "--max-size", "0"],
    ["store", "gc", "--max-size", "100G"],
    ["gc", "--max-size", "0"],
    ["store", "verify", "--fix"],
    ["store", "rm", "tiny-llama"],
)


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_home_that_is_a_folder_registry_loses_nothing_to_any_deleting_command(tmp_path, scenario):
    """The data-loss case of issue 32: a node pre-seeded by copying the registry into its cache folder."""
    registry, _targets = published_set(tmp_path, scenario)
    home = tmp_path / "node-cache"
    shutil.copytree(registry.root, home)
    before = _files(home)
    assert sum(name.startswith("index/") for name in before) == 3
    for args in DELETING:
        got = prebake(*args, env=prebake_env(home))
        assert got.returncode == EXIT_STORE, (args, got.stdout, got.stderr)
        assert f"{home} looks like a folder registry" in got.stderr, (args, got.stderr)
        assert "index/" in got.stderr and "PREBAKE_REGISTRY" in got.stderr and "Traceback" not in got.stderr
    assert _files(home) == before  # 6 of 6 files (3 index entries, 3 blobs) kept, byte for byte
    got = prebake(*fetch_args(home), env=prebake_env(tmp_path / "store"))  # the fix it names works
    assert got.returncode == 0, got.stderr


def test_a_home_holding_other_files_loses_none_of_them_and_gets_no_store_written_into_it(tmp_path, scenario):
    """PREBAKE_HOME=$HOME by mistake: even folders named as the store's own (tmp/, index/) keep their files."""
    registry, _targets = published_set(tmp_path, scenario)
    home = tmp_path / "user-home"
    for name, text in {
        ".bashrc": "alias ll='ls -l'\n",
        "notes.txt": "mine\n",
        "tmp/draft.txt": "a draft\n",
        "index/README": "an index of my own\n",
        "blobs/sha256/ab/photo.tar.zst": "not a bundle\n",
    }.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    before = _files(home)
    for args in (*DELETING, fetch_args(registry.root)):
        got = prebake(*args, env=prebake_env(home))
        assert got.returncode == EXIT_STORE, (args, got.stdout, got.stderr)
        assert f"{home} is not a prebake store" in got.stderr and ".bashrc" in got.stderr, (args, got.stderr)
    assert _files(home) == before
    assert not (home / MARK).exists()


def test_a_store_of_a_newer_prebake_is_refused_by_every_command_and_not_damaged(tmp_path, scenario):
    """A store written by a later release (simulated: its mark says a format above ours) is neither read,
    written nor deleted by this one: the fleet rolled back one node's prebake."""
    registry, targets = published_set(tmp_path, scenario)
    home = scenario.store(tmp_path / "home")
    assert prebake(*fetch_args(registry.root), env=prebake_env(home)).returncode == 0
    assert json.loads((home / MARK).read_text()) == {
        "format": "prebake-store",
        "version": STORE_VERSION,
        "release": release(),
    }
    (home / MARK).write_text(
        json.dumps({"format": "prebake-store", "version": STORE_VERSION + 1, "release": "prebake 9.9.9"})
    )
    before = _files(home)
    for args in (*DELETING, fetch_args(registry.root), ["store", "ls"], ["store", "verify"]):
        got = prebake(*args, env=prebake_env(home))
        assert got.returncode == EXIT_STORE, (args, got.stdout, got.stderr)
        assert (
            f"{home} is a store of a newer prebake (store format {STORE_VERSION + 1}, made by prebake 9.9.9"
            in got.stderr
        ), got.stderr
        assert "upgrade prebake" in got.stderr
    assert _files(home) == before
    (home / MARK).write_text(json.dumps({"format": "prebake-store", "version": STORE_VERSION}))  # for the re-check


def test_inside_a_store_gc_deletes_only_the_bundles_it_installed(tmp_path, scenario):
    """A registry copied into a marked store's own folders (same layout, same names) keeps every file;
    the store's own bundles go as the bound says."""
    registry, targets = published_set(tmp_path, scenario)
    home = scenario.store(tmp_path / "home")
    assert prebake(*fetch_args(registry.root), env=prebake_env(home)).returncode == 0
    installed = {p.name for p in (home / INSTALLS).iterdir()}
    assert installed == {m.blob.hex for m in targets.manifests.values()}
    foreign = FileRegistry(tmp_path / "other")  # another registry's bundle, copied in
    other = make_bundle(tmp_path / "other-bake", model="other-model", payload_bytes=16 << 10)
    foreign.publish(other.manifest, other.blob)
    for path in foreign.root.rglob("*"):
        if path.is_file():
            dest = home / path.relative_to(foreign.root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                shutil.copy2(path, dest)
    copied = _files(foreign.root)
    got = prebake("store", "gc", "--max-size", "0", "--json", env=prebake_env(home))
    assert got.returncode == 0, got.stderr
    assert {h.removeprefix("sha256:") for h in json.loads(got.stdout)["evicted"]} == installed
    assert not list((home / "trees").glob("[0-9a-f]*")) and not list((home / INSTALLS).iterdir())
    kept = _files(home)
    assert {name: kept.get(name) for name in copied} == copied  # its index entry and blob, byte for byte


@pytest.mark.parametrize("damage", ["none", "unreadable-entry"])
def test_a_store_made_before_the_mark_is_adopted_with_its_bundles_and_its_entries_kept(tmp_path, scenario, damage):
    """A store of the release before the mark (no mark, no installs/): adopted by the first writer,
    its trees recorded as installed, so gc evicts them; an unreadable entry is moved aside, not deleted."""
    registry, targets = published_set(tmp_path, scenario)
    home = scenario.store(tmp_path / "home")
    assert prebake(*fetch_args(registry.root), env=prebake_env(home)).returncode == 0
    (home / MARK).unlink()
    shutil.rmtree(home / INSTALLS)  # now laid out as the release before the mark left it
    if damage == "unreadable-entry":
        entry = next((home / "index").rglob("*.json"))
        entry.write_text("{cut sh")
    got = prebake("store", "gc", "--max-size", "0", "--json", env=prebake_env(home))
    assert got.returncode == 0, got.stderr
    assert json.loads((home / MARK).read_text())["version"] == STORE_VERSION
    assert len(json.loads(got.stdout)["evicted"]) == len(targets.manifests)
    if damage == "unreadable-entry":
        moved = list((home / "quarantine").rglob("*.json"))
        assert [p.read_text() for p in moved] == ["{cut sh"]
