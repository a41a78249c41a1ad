"""Many processes on one node: one download per blob, one winner per key, no reader sees half a tree."""

from __future__ import annotations

import pytest

from prebake.registry.backends.file import FileRegistry
from tests.faults.checks import tree_problems
from tests.faults.procs import actor, racing_bakers, result, unbounded

FETCHERS = 6


def test_six_processes_fetching_one_bundle_download_it_once_and_share_one_verified_tree(tmp_path, published, scenario):
    registry, bundle = published
    home, count, go = scenario.store(tmp_path / "home"), tmp_path / "downloads.log", tmp_path / "go"
    args = [
        "--home",
        str(home),
        "--registry",
        str(registry.root),
        "--key",
        bundle.manifest.key_digest,
        "--count",
        str(count),
        "--delay",
        "0.5",
        "--go",
        str(go),
    ]
    procs = [actor("fetch", *args) for _ in range(FETCHERS)]
    go.touch()  # all start together; the first to take the blob's lock downloads for 0.5 s, the rest wait
    results = [result(p) for p in procs]

    downloads = count.read_text().splitlines()
    assert len(downloads) == 1, f"the blob was downloaded {len(downloads)} times: {downloads}"
    assert {r["tree"] for r in results} == {str(unbounded(home).tree_path(bundle.manifest))}
    assert all(r["problems"] == [] for r in results)
    installed = unbounded(home).lookup("graphs", bundle.manifest.key_digest)
    assert tree_problems(installed.tree, bundle.manifest) == []


@pytest.mark.parametrize("builds", [("same", "same"), ("one", "two")], ids=["identical-builds", "different-builds"])
def test_two_bakers_publishing_one_key_at_once_leave_exactly_one_entry_and_neither_fails(tmp_path, scenario, builds):
    registry = FileRegistry(tmp_path / "registry")
    results = racing_bakers(tmp_path, scenario, str(registry.root), builds)

    assert sorted(r["created"] for r in results) == [False, True]
    loser = next(r for r in results if not r["created"])
    expected = "already published (identical bundle)" if builds[0] == builds[1] else "another baker won"
    assert loser["note"].startswith(expected)
    entries = list(registry.list("buckets"))
    assert len(entries) == 1
    winner = entries[0]
    assert {r["blob"] for r in results} == {winner.blob.digest}, "both bakers end up using the entry that won"
    scenario.registry(registry, winner)
    for r in results:
        assert r["tree"].endswith(winner.blob.hex)


def test_readers_holding_a_bundle_never_see_half_a_tree_while_another_process_installs_and_evicts_it(
    tmp_path, published, scenario
):
    registry, bundle = published
    home = scenario.store(tmp_path / "home")
    common = [
        "--home",
        str(home),
        "--registry",
        str(registry.root),
        "--key",
        bundle.manifest.key_digest,
        "--go",
        str(tmp_path / "go"),
    ]
    churn = actor("churn", *common, "--seconds", "3")
    readers = [actor("read", *common, "--seconds", "3") for _ in range(2)]
    (tmp_path / "go").touch()
    cycles = result(churn)["cycles"]
    seen = [result(r) for r in readers]

    assert all(s["partial"] == [] for s in seen), seen
    assert sum(s["complete"] for s in seen) > 0, f"the readers never saw the bundle installed: {seen}"
    assert sum(s["nothing"] + s["evicted_before_held"] for s in seen) > 0 or cycles <= 1, (
        f"the bundle was never evicted under the readers, so the scenario tested nothing: {seen}, {cycles} cycles"
    )
    assert cycles >= 2, f"the churner installed and evicted only {cycles} time(s)"
