"""Persistent stats: fetches record hits, misses with reasons, bytes and seconds saved; many processes at once."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prebake.artifacts.errors import StoreError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.keys import Key
from prebake.artifacts.store import stats
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.settings import StoreLimits
from prebake.artifacts.store.stats import events, ledger
from prebake.engine.cli import main
from prebake.registry.backends.file import FileRegistry
from tests.support.bundles import make_bundle

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path, monkeypatch) -> Store:
    monkeypatch.delenv(stats.STATS_ENV, raising=False)
    return Store(tmp_path / "home", StoreLimits())


@pytest.fixture
def registry(tmp_path) -> FileRegistry:
    return FileRegistry(tmp_path / "registry")


def _publish(tmp_path, registry, model="tiny-llama", build_seconds=None):
    bundle = make_bundle(tmp_path / "bake", model=model)
    manifest = bundle.manifest.model_copy(update={"build_seconds": build_seconds})
    registry.publish(manifest, bundle.blob)
    return manifest


def test_a_registry_hit_then_a_store_hit_count_bytes_once_and_save_the_build_time_twice(tmp_path, store):
    manifest = make_bundle(tmp_path).manifest.model_copy(update={"build_seconds": 2.5})
    stats.record_outcomes(store, [(manifest, "registry")], [])
    stats.record_outcomes(store, [(manifest, "store")], [])
    graphs = ledger.read_stats(store).to_json()["kinds"]["graphs"]
    assert graphs["registry_hits"] == 1 and graphs["store_hits"] == 1 and graphs["misses"] == 0
    assert graphs["hit_rate"] == 1.0
    assert graphs["bytes_fetched"] == manifest.blob.size
    assert graphs["seconds_saved"] == 5.0 and graphs["untimed_hits"] == 0


def test_a_miss_records_its_reason_class_text_and_the_factors_that_differ(tmp_path, store, registry):
    _publish(tmp_path, registry)
    other = Key.of(
        "graphs", {"model": {"name": "tiny-llama", "config": "sha256-of-config"}, "software": {"torch": "9"}}
    )
    miss = fetch_key(store, registry, other)
    assert isinstance(miss, Miss)
    stats.record_outcomes(store, [], [("graphs", miss.reason, miss.differing, other.digest)])
    report = ledger.read_stats(store).to_json()
    assert report["kinds"]["graphs"]["misses"] == 1 and report["kinds"]["graphs"]["hit_rate"] == 0.0
    [reason] = report["miss_reasons"]
    assert reason["reason"] == "no-bundle" and reason["count"] == 1 and "no bundle for this key" in reason["example"]
    assert report["differing_factors"] == [{"factor": "software.torch", "count": 1}]


def test_bundles_baked_before_build_times_were_recorded_count_as_untimed_hits(tmp_path, store):
    stats.record_outcomes(store, [(make_bundle(tmp_path).manifest, "registry")], [])
    total = ledger.read_stats(store).to_json()["total"]
    assert total["hits"] == 1 and total["seconds_saved"] == 0 and total["untimed_hits"] == 1


def test_a_manifest_without_a_build_time_keeps_its_old_bytes(tmp_path):
    manifest = make_bundle(tmp_path).manifest
    assert b"build_seconds" not in manifest.to_bytes()
    timed = manifest.model_copy(update={"build_seconds": 1.25})
    assert json.loads(timed.to_bytes())["build_seconds"] == 1.25
    assert type(manifest).parse(timed.to_bytes(), "test").build_seconds == 1.25


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        ("no bundle for this key in file:///r", "no-bundle"),
        ("registry s3://b did not answer within 5 s (--registry-timeout); serving without it", "timeout"),
        ("fetching blob sha256:abc failed: digest mismatch", "bad-blob"),
        ("refused by the trust policy: unsigned; trust requires a signature by one of: ci", "untrusted"),
        ("the registry's entry for abc carries another key; it was tampered with", "tampered"),
        ("registry s3://b failed: ConnectionError: refused", "registry-down"),
        ("/s/trees/x (graphs abc) was evicted before it could be held; fetch it again", "evicted"),
        ("the installed graphs did not load; compiling in place", "does-not-load"),
        ("something new", "other"),
    ],
)
def test_miss_reasons_fall_into_short_classes(reason, cls):
    assert events.classify(reason) == cls


def test_fallback_compiles_and_their_seconds_are_counted(store):
    stats.record_fallback(store, "graphs", 12.5)
    stats.record_fallback(store, "autotune")
    kinds = ledger.read_stats(store).to_json()["kinds"]
    assert kinds["graphs"]["fallback_compiles"] == 1 and kinds["graphs"]["fallback_seconds"] == 12.5
    assert kinds["autotune"]["fallback_compiles"] == 1 and kinds["autotune"]["hit_rate"] is None


def test_a_variant_that_did_not_load_is_counted_apart_from_misses_and_compiles(store):
    stats.record_variant_fallback(store, "graphs", "aoti-package", "dynamo-precompile", "another torch")
    report = ledger.read_stats(store)
    graphs = report.to_json()["kinds"]["graphs"]
    assert graphs["variant_fallbacks"] == 1 and graphs["misses"] == 0 and graphs["fallback_compiles"] == 0
    assert "1 start(s) whose bundle's variant did not load here took the next variant" in report.render()


def test_zero_prints_the_counts_then_starts_again(store):
    stats.record_outcomes(store, [], [("graphs", "no bundle for this key in x", (), "")])
    zeroed = ledger.read_stats(store, zero=True)
    assert zeroed.zeroed and zeroed.to_json()["events"] == 1
    after = ledger.read_stats(store).to_json()
    assert after["events"] == 0 and after["kinds"] == {} and after["since"] is not None


def test_a_torn_line_is_skipped_and_counted_never_fatal(store):
    stats.record_fallback(store, "graphs")
    with (store.home / "stats" / "events.jsonl").open("ab") as f:
        f.write(b'{"at": 1, "event": "hi')  # a write cut short by a full disk
    stats.record_fallback(store, "graphs")
    report = ledger.read_stats(store).to_json()
    assert report["events"] == 2 and report["skipped_lines"] == 1


def test_recording_off_records_nothing(store, monkeypatch):
    monkeypatch.setenv(stats.STATS_ENV, "off")
    stats.record_fallback(store, "graphs")
    assert ledger.read_stats(store).to_json()["events"] == 0


def test_an_unwritable_stats_folder_loses_the_event_not_the_caller(store):
    (store.home / "stats").mkdir(parents=True)
    (store.home / "stats" / "events.jsonl").mkdir()  # not a file: every append fails
    stats.record_fallback(store, "graphs")  # returns: the start-up that called it goes on
    with pytest.raises(StoreError, match=r"cannot read the stats file .*events\.jsonl.*remove it"):
        ledger.read_stats(store)  # `prebake stats` names the file and the fix, not a bare IsADirectoryError
    (store.home / "stats" / "events.jsonl").rmdir()  # the operator fixes the folder
    stats.record_fallback(store, "autotune")
    assert ledger.read_stats(store).to_json()["events"] == 1  # the lost event stays lost; recording resumes


def test_compaction_keeps_every_count(store):
    for i in range(5):
        stats.record_outcomes(store, [], [("graphs", f"no bundle for this key in r{i}", ["software.torch"], "")])
    ledger.compact(store)
    stats.record_fallback(store, "graphs", 1.0)
    folder = store.home / "stats"
    assert json.loads((folder / "summary.json").read_text())["events"] == 5
    report = ledger.read_stats(store).to_json()
    assert report["events"] == 6 and report["kinds"]["graphs"]["misses"] == 5
    assert report["miss_reasons"][0]["example"] == "no bundle for this key in r4"
    assert report["differing_factors"] == [{"factor": "software.torch", "count": 5}]


def test_a_compaction_killed_after_renaming_loses_nothing(store):
    for _ in range(3):
        stats.record_fallback(store, "graphs")
    folder = store.home / "stats"
    (folder / "events.jsonl").rename(folder / "events-1.jsonl")  # killed here: the summary was not written
    stats.record_fallback(store, "graphs")
    assert ledger.read_stats(store).to_json()["events"] == 4
    assert ledger.compact(store).events == 4
    assert ledger.read_stats(store).to_json()["events"] == 4


def test_a_compaction_killed_before_deleting_its_segment_counts_it_once(store):
    for _ in range(3):
        stats.record_fallback(store, "graphs")
    folder = store.home / "stats"
    saved = (folder / "events.jsonl").read_bytes()
    ledger.compact(store)  # generation 1 holds those 3
    (folder / "events-1.jsonl").write_bytes(saved)  # as if the compaction died before deleting it
    assert ledger.read_stats(store).to_json()["events"] == 3
    stats.record_fallback(store, "graphs")
    assert ledger.compact(store).events == 4


_WRITER = textwrap.dedent(
    """
    import sys
    from prebake.artifacts.store import stats
    from prebake.artifacts.store.local import Store
    from prebake.artifacts.store.settings import StoreLimits
    stats.COMPACT_BYTES = 6000  # compact often: writers fold while the others append
    store = Store(sys.argv[1], StoreLimits())
    n = int(sys.argv[2])
    for i in range(n):
        if i % 3 == 0:
            stats.record_outcomes(store, [], [("graphs", "no bundle for this key in r", ["software.torch"], "")])
        elif i % 3 == 1:
            stats.record_fallback(store, "autotune", 0.5)
        else:
            stats.record_outcomes(store, [], [("buckets", "registry r did not answer within 5 s", (), "")])
    """
)


def test_many_processes_recording_at_once_lose_and_double_no_event(store):
    writers, each = 6, 150
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(store.home), str(each)], cwd=ROOT) for _ in range(writers)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * writers
    report = ledger.read_stats(store).to_json()
    assert report["events"] == writers * each and report["skipped_lines"] == 0
    kinds = report["kinds"]
    assert kinds["graphs"]["misses"] == writers * each // 3
    assert kinds["autotune"]["fallback_compiles"] == writers * each // 3
    assert kinds["autotune"]["fallback_seconds"] == pytest.approx(0.5 * writers * each / 3)
    assert kinds["buckets"]["misses"] == writers * each // 3
    assert {r["reason"]: r["count"] for r in report["miss_reasons"]} == {
        "no-bundle": writers * each // 3,
        "timeout": writers * each // 3,
    }
    assert (store.home / "stats" / "summary.json").exists()  # it did compact along the way


def test_prebake_stats_prints_a_table_and_json(store, monkeypatch, capsys):
    monkeypatch.setenv("PREBAKE_HOME", str(store.home))
    stats.record_outcomes(store, [], [("graphs", "no bundle for this key in r", ["software.torch"], "")])
    stats.record_fallback(store, "graphs", 3.0)
    assert main(["stats"]) == 0
    out = capsys.readouterr().out
    assert "graphs" in out and "no-bundle" in out and "software.torch x1" in out
    assert main(["stats", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {
        "store",
        "since",
        "events",
        "skipped_lines",
        "kinds",
        "total",
        "miss_reasons",
        "differing_factors",
        "zeroed",
        "store_bytes",
        "max_bytes",
    }
    assert data["total"]["misses"] == 1 and data["total"]["fallback_compiles"] == 1
    assert main(["stats", "--zero", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["zeroed"] is True
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["events"] == 0


def test_an_unreadable_summary_says_to_zero_and_zero_recovers(store, monkeypatch, capsys):
    monkeypatch.setenv("PREBAKE_HOME", str(store.home))
    stats.record_fallback(store, "graphs")
    (store.home / "stats" / "summary.json").write_text("{not json")
    assert main(["stats"]) == 2
    assert "run prebake stats --zero" in capsys.readouterr().err
    stats.record_fallback(store, "graphs")  # recording goes on: it reads the summary only to compact
    assert main(["stats", "--zero"]) == 0
    capsys.readouterr()
    assert main(["stats", "--json"]) == 0 and json.loads(capsys.readouterr().out)["events"] == 0
