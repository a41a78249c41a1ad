"""Releases read each other's bundles and stores (docs/trust-and-failure.md, "Compatibility between releases").

The fixtures under tests/compat/fixtures/<release>/ were written by older commits of this repository
(tests/compat/make_fixtures.py; each folder's made-by.json names its commit): a folder registry with one
signed bundle and a store that installed it. This release uses, migrates or clearly refuses each, and a
store or manifest of a newer format is refused, never misread and never damaged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from prebake.artifacts.bundle.manifest import SIGNATURE_VERSION, Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.keys import Key
from prebake.artifacts.store import admin as store_admin
from prebake.artifacts.store import mark
from prebake.artifacts.store.inventory import list_bundles
from prebake.artifacts.store.local import Installed, Store
from prebake.artifacts.store.mark import INSTALLS, MARK, STORE_VERSION, StoreHomeError
from prebake.artifacts.store.settings import StoreLimits
from prebake.registry.backends.file import FileRegistry
from prebake.registry.trust.signing import ACCEPT_V1_ENV, TRUSTED_KEYS_ENV, trust_from_env

FIXTURES = Path(__file__).resolve().parents[1] / "compat" / "fixtures"
RELEASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "made-by.json").is_file())


def _copy(release: str, tmp_path: Path) -> tuple[Path, dict]:
    dest = tmp_path / release
    shutil.copytree(FIXTURES / release, dest, symlinks=True)
    return dest, json.loads((dest / "made-by.json").read_text())


def _key(made: dict, root: Path) -> Key:
    return Manifest.read(root / "registry" / "index" / made["kind"] / f"{made['key_digest']}.json").the_key()


def _trust(root: Path, *, accept_v1: bool):
    env = {TRUSTED_KEYS_ENV: (root / "signer.pub").read_text().strip(), ACCEPT_V1_ENV: "1" if accept_v1 else ""}
    return trust_from_env(env)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_fixtures_cover_both_signature_versions_and_a_store_before_file_records():
    made = {r: json.loads((FIXTURES / r / "made-by.json").read_text()) for r in RELEASES}
    assert {m["signature_version"] for m in made.values()} == {1, SIGNATURE_VERSION}
    assert any(not list((FIXTURES / r / "store" / "trees").glob("*.files")) for r in RELEASES)
    assert all(not (FIXTURES / r / "store" / MARK).exists() for r in RELEASES)  # made before the mark


@pytest.mark.parametrize("release", RELEASES)
def test_an_older_releases_registry_is_read_and_its_signature_decided_as_documented(release, tmp_path):
    root, made = _copy(release, tmp_path)
    registry, key = FileRegistry(root / "registry"), _key(made, root)
    store = Store(tmp_path / "new-home", StoreLimits())
    strict = fetch_key(store, registry, key, trust=_trust(root, accept_v1=False))
    if made["signature_version"] == 1:  # refused with the reason and the switch, not misread
        assert isinstance(strict, Miss) and strict.refused
        assert "version 1 did not cover the labels" in strict.reason and ACCEPT_V1_ENV in strict.reason
        got = fetch_key(store, registry, key, trust=_trust(root, accept_v1=True))
    else:
        got = strict
    assert isinstance(got, Installed), got
    assert got.manifest.blob.digest == made["blob"]


@pytest.mark.parametrize("release", RELEASES)
def test_an_older_releases_store_is_read_adopted_on_first_write_and_its_bundles_stay_ours(release, tmp_path):
    root, made = _copy(release, tmp_path)
    home, key = root / "store", _key(made, root)
    store = Store(home, StoreLimits())
    hit = store.lookup(made["kind"], made["key_digest"])  # read as it is: no mark needed to read
    assert hit is not None and hit.tree == home / made["tree"]
    assert not (home / MARK).exists()
    again = fetch_key(store, FileRegistry(root / "registry"), key, trust=_trust(root, accept_v1=True))
    assert isinstance(again, Installed) and again.tree == hit.tree
    assert store_admin.verify_store(store).findings == ()
    listed = list_bundles(store)  # a reader lists its bundles before any writer adopted it
    assert [b.hex for b in listed] == [made["blob"].removeprefix("sha256:")] and not (home / MARK).exists()
    assert store.gc(1 << 40) is not None  # the first write: adopts it
    assert json.loads((home / MARK).read_text()) == {
        "format": "prebake-store",
        "version": STORE_VERSION,
        "release": mark.release(),
    }
    assert (home / INSTALLS / made["blob"].removeprefix("sha256:")).is_file()  # its tree was recorded as ours
    store.install(again.manifest, FileRegistry(root / "registry"))  # records the file list it lacked, if it did
    assert (home / "trees" / f"{made['blob'].removeprefix('sha256:')}.files").is_file()
    report = store.gc(0)
    assert report is not None and report.evicted == (made["blob"].removeprefix("sha256:"),)


def test_a_manifest_of_a_newer_schema_is_refused_naming_both_versions_and_nothing_is_deleted(tmp_path):
    root, made = _copy(RELEASES[-1], tmp_path)
    for folder in ("registry", "store"):
        entry = root / folder / "index" / made["kind"] / f"{made['key_digest']}.json"
        data = json.loads(entry.read_text())
        entry.write_text(json.dumps({**data, "schema_version": "2"}))
    with pytest.raises(BundleError, match="has schema 2, this prebake reads 1; upgrade prebake"):
        FileRegistry(root / "registry").lookup(made["kind"], made["key_digest"])
    store = Store(root / "store", StoreLimits())
    before = _files(root / "store")
    assert store.lookup(made["kind"], made["key_digest"]) is None  # a miss for this release
    assert store_admin.verify_store(store, fix=True).findings == ()  # another release's entry is not damage
    after = _files(root / "store")
    assert {n: after.get(n) for n in before} == before  # nothing moved aside, healed or deleted


def test_a_store_of_a_newer_format_is_refused_by_this_reader_and_left_as_it_was(tmp_path):
    root, made = _copy(RELEASES[-1], tmp_path)
    home = root / "store"
    (home / MARK).write_text(
        json.dumps({"format": "prebake-store", "version": STORE_VERSION + 1, "release": "prebake 9.9.9"})
    )
    before = _files(home)
    store = Store(home, StoreLimits())
    for act in (
        lambda: store.lookup(made["kind"], made["key_digest"]),
        lambda: store.gc(0),
        lambda: store.gc(0, dry_run=True),
        lambda: store_admin.verify_store(store, fix=True),
        lambda: list_bundles(store),
        lambda: store.recover(),
    ):
        with pytest.raises(
            StoreHomeError,
            match=f"store of a newer prebake \\(store format {STORE_VERSION + 1}, made by prebake 9.9.9;",
        ):
            act()
    assert _files(home) == before


@pytest.mark.parametrize("release", RELEASES)
def test_a_renamed_key_factor_costs_one_explained_miss(release, tmp_path):
    """A release that renames a factor (or a variant, which is a factor) asks for a key no older bundle
    answers: one miss naming the factor, then a bake; never a wrong hit."""
    root, made = _copy(release, tmp_path)
    old = _key(made, root)
    groups = {group: dict(factors) for group, factors in old.groups}
    groups["software"] = {"torch_version": groups["software"].pop("torch")}  # the factor, renamed
    renamed = Key.of(old.kind, groups)
    got = fetch_key(Store(tmp_path / "home", StoreLimits()), FileRegistry(root / "registry"), renamed)
    assert isinstance(got, Miss) and not got.refused and got.nearest == old
    assert any("torch" in name for name in got.differing), got.explain()
