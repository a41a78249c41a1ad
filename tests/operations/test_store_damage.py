"""A damaged store entry is found and healed, not trusted: the hit path's cheap check moves it
aside and installs it again from the registry, and `prebake store verify` reports every case."""

from __future__ import annotations

import json

import pytest

from prebake.artifacts.layout import index_relpath
from tests.operations.target import KINDS, fetch_args, prebake, prebake_env, published_set
from tests.support.bundles import tampered


@pytest.fixture
def installed(tmp_path, scenario):
    """tiny-llama's three bundles in a folder registry, fetched once into a store."""
    registry, targets = published_set(tmp_path, scenario)
    home = scenario.store(tmp_path / "home")
    got = prebake(*fetch_args(registry.root, "--json"), env=prebake_env(home))
    assert got.returncode == 0, got.stderr
    return registry, targets, home


def _verify(home) -> tuple[int, dict]:
    got = prebake("store", "verify", "--json", env=prebake_env(home))
    return got.returncode, json.loads(got.stdout)


def _fetch(registry, home) -> tuple[int, dict, str]:
    got = prebake(*fetch_args(registry.root, "--json"), env=prebake_env(home))
    return got.returncode, json.loads(got.stdout) if got.stdout.strip() else {}, got.stderr


def _entry(home, targets, kind):
    return home / index_relpath(kind, targets.manifests[kind].key_digest)


def _tree(home, targets, kind):
    return home / "trees" / targets.manifests[kind].blob.hex


def _cut_in_half(path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _empty(path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [_cut_in_half, _empty], ids=["cut-in-half", "empty"])
def test_a_damaged_index_entry_is_reported_by_verify_and_healed_by_the_next_fetch(installed, damage):
    registry, targets, home = installed
    entry = _entry(home, targets, "autotune")
    damage(entry)

    code, report = _verify(home)
    assert code == 1 and report["bad"] >= 1, report
    [finding] = [f for f in report["findings"] if f["keys"] == [targets.manifests["autotune"].key_digest]]
    assert "index entry" in finding["problems"][0]

    code, payload, err = _fetch(registry, home)
    assert code == 0 and payload["complete"], err
    assert f"store {home}: its autotune" in err and "republish" not in err
    assert payload["bundles"]["autotune"]["blob"] == targets.manifests["autotune"].blob.digest
    assert entry.read_bytes() == targets.manifests["autotune"].to_bytes()  # installed again, whole
    assert list((home / "quarantine" / "index" / "autotune").iterdir())  # the damaged one, kept aside
    code, report = _verify(home)
    assert code == 0 and report["bad"] == 0, report


def _remove_a_file(tree) -> None:
    (tree / "sub" / "entry.txt").unlink()


def _truncate_a_file(tree) -> None:
    (tree / "payload.bin").write_bytes(b"")


def _replace_a_file_by_a_folder(tree) -> None:
    (tree / "payload.bin").unlink()
    (tree / "payload.bin").mkdir()


@pytest.mark.parametrize(
    "damage", [_remove_a_file, _truncate_a_file, _replace_a_file_by_a_folder], ids=["removed", "truncated", "folder"]
)
def test_a_tree_a_cleaner_damaged_is_fetched_again_not_handed_out(installed, damage):
    registry, targets, home = installed
    for kind in ("buckets", "graphs"):
        damage(tampered(_tree(home, targets, kind)))  # a cleaner with write rights: the store seals trees

    code, report = _verify(home)
    assert code == 1 and report["bad"] == 2, report

    code, payload, err = _fetch(registry, home)
    assert code == 0 and payload["complete"], err
    for kind in ("buckets", "graphs"):
        assert f"store {home}: its {kind}" in err
        tree = _tree(home, targets, kind)
        assert (tree / "sub" / "entry.txt").is_file() and (tree / "payload.bin").is_file()
    code, report = _verify(home)
    assert code == 0 and report["bad"] == 0, report


def test_verify_fix_moves_a_damaged_entry_aside_and_the_next_fetch_installs_it(installed):
    registry, targets, home = installed
    _cut_in_half(_entry(home, targets, "graphs"))
    got = prebake("store", "verify", "--fix", env=prebake_env(home))
    assert got.returncode == 1 and "moved aside to" in got.stdout, got.stdout
    assert not _entry(home, targets, "graphs").exists()
    code, payload, err = _fetch(registry, home)
    assert code == 0 and sorted(payload["bundles"]) == sorted(KINDS), err
    assert _verify(home)[1]["bad"] == 0


def test_a_serve_start_heals_a_damaged_entry_and_a_damaged_tree_and_serves(baked, tmp_path, scenario):
    home = scenario.store(tmp_path / "home")
    first = baked.serve(home)
    first.wait_ready(300)
    first.stop()
    entries = sorted((home / "index").glob("*/*.json"))
    assert len(entries) == 2, entries  # buckets and autotune
    _cut_in_half(entries[0])
    other = json.loads(entries[1].read_bytes())
    tree = tampered(home / "trees" / other["blob"]["digest"].removeprefix("sha256:"))
    victim = next(p for p in tree.rglob("*") if p.is_file())
    victim.unlink()  # an age-based cleaner's work

    again = baked.serve(home)
    try:
        again.wait_ready(300)
        assert again.complete(prompt=[1, 2, 3], max_tokens=3, temperature=0)["choices"][0]["token_ids"]
    finally:
        again.stop()
    assert again.log.count(f"store {home}: its ") == 2, again.log
    assert victim.is_file() and "miss:" not in again.log
    code, report = _verify(home)
    assert code == 0 and report["bad"] == 0, report
