"""The operator's view of the store: store ls | verify [--fix] | rm, gc --dry-run, with and without --json."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.store import admin as store_admin
from prebake.artifacts.store.inventory import list_bundles
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.mark import record_install
from prebake.artifacts.store.settings import StoreLimits
from prebake.engine.cli import main
from prebake.registry.backends.file import FileRegistry
from tests.support.bundles import Bundle, make_bundle, tampered

ROOT = Path(__file__).resolve().parents[2]

_HOLDER = textwrap.dedent(
    """
    import sys
    from prebake.artifacts.store.local import Store
    from prebake.artifacts.store.settings import StoreLimits
    store = Store(sys.argv[1], StoreLimits())
    installed = store.lookup(sys.argv[2], sys.argv[3])
    with store.use(installed):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes our stdin
    """
)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("PREBAKE_HOME", str(home))
    monkeypatch.setenv("PREBAKE_STATS", "off")
    monkeypatch.delenv("PREBAKE_STORE_MAX_BYTES", raising=False)
    return home


@pytest.fixture
def installed(tmp_path, home) -> dict[str, Bundle]:
    """Three bundles installed in the store: tiny-llama graphs and autotune, other-model graphs."""
    registry = FileRegistry(tmp_path / "registry")
    bundles = {
        "tiny-graphs": make_bundle(tmp_path / "bake", model="tiny-llama"),
        "tiny-autotune": make_bundle(tmp_path / "bake", kind="autotune", model="tiny-llama"),
        "other-graphs": make_bundle(tmp_path / "bake", model="other-model"),
    }
    store = Store(home, StoreLimits())
    for b in bundles.values():
        registry.publish(b.manifest, b.blob)
        assert not isinstance(fetch_key(store, registry, b.manifest.the_key()), Miss)
    return bundles


class _Held:
    """A real process holding one bundle's tree with Store.use, as a serving engine does."""

    def __init__(self, home: Path, bundle: Bundle):
        m = bundle.manifest
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(home), m.kind, m.key_digest],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "held"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _tree(home: Path, bundle: Bundle) -> Path:
    return home / "trees" / bundle.manifest.blob.hex


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_store_ls_lists_every_bundle_with_its_size_and_last_use(installed, home, capsys):
    code, out = _run(capsys, "store", "ls")
    assert code == 0
    assert "tiny-llama" in out and "other-model" in out and "autotune" in out
    assert "3 bundle(s)" in out
    code, out = _run(capsys, "store", "ls", "--json")
    data = json.loads(out)
    assert set(data) == {"store", "total_bytes", "bundles"}
    assert len(data["bundles"]) == 3 and data["total_bytes"] == sum(b["bytes"] for b in data["bundles"])
    row = data["bundles"][0]
    assert set(row) == {
        "blob",
        "bytes",
        "tree",
        "blob_file",
        "last_use",
        "held",
        "holders",
        "entries",
        "unreadable_entries",
    }
    assert row["tree"] and row["blob_file"] and row["held"] is False
    assert set(row["entries"][0]) == {"kind", "key", "model", "labels", "created", "build_seconds"}


def test_store_ls_says_which_bundle_a_live_engine_holds_and_its_pid(installed, home, capsys):
    with _Held(home, installed["tiny-graphs"]) as held:
        data = json.loads(_run(capsys, "store", "ls", "--json")[1])
        rows = {r["blob"]: r for r in data["bundles"]}
        row = rows[installed["tiny-graphs"].manifest.blob.digest]
        assert row["held"] is True and held.proc.pid in row["holders"]
        assert rows[installed["other-graphs"].manifest.blob.digest]["held"] is False
        assert f"yes (pid {held.proc.pid})" in _run(capsys, "store", "ls")[1]
    assert not list_bundles(Store())[0].held


def test_an_empty_store_lists_nothing(home, capsys):
    assert _run(capsys, "store", "ls") == (0, f"no bundles installed in {home}\n")
    assert json.loads(_run(capsys, "store", "ls", "--json")[1])["bundles"] == []


def test_store_verify_passes_an_intact_store(installed, home, capsys):
    code, out = _run(capsys, "store", "verify")
    assert code == 0 and "3 bundle(s), 3 ok, 0 bad" in out


def test_store_verify_finds_a_changed_file_and_fix_removes_it_so_fetch_installs_it_again(
    tmp_path, installed, home, capsys
):
    bundle = installed["tiny-graphs"]
    (tampered(_tree(home, bundle)) / "fxgraph" / "entry.txt").write_text("edited by hand\n")
    code, out = _run(capsys, "store", "verify", "--json")
    data = json.loads(out)
    assert code == 1 and data["bad"] == 1 and data["ok"] == 2
    [finding] = data["findings"]
    assert finding["blob"] == bundle.manifest.blob.digest and finding["action"] is None
    assert any("wrong bytes in fxgraph/entry.txt" in p for p in finding["problems"])

    code, out = _run(capsys, "store", "verify", "--fix")
    assert code == 1 and "removed; the next fetch installs it again" in out
    assert not _tree(home, bundle).exists()
    assert _run(capsys, "store", "verify")[0] == 0
    got = fetch_key(Store(), FileRegistry(tmp_path / "registry"), bundle.manifest.the_key())
    assert (got.tree / "fxgraph" / "entry.txt").read_text() == "graphs tiny-llama first\n"


def test_store_verify_finds_extra_and_missing_files_and_a_damaged_blob(installed, home, capsys):
    tree = tampered(_tree(home, installed["tiny-graphs"]))
    (tree / "kernels.bin").unlink()
    (tree / "planted.so").write_bytes(b"x")
    blob = Store().blob_path(installed["other-graphs"].manifest.blob.digest)
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")
    report = store_admin.verify_store(Store())
    problems = {f.blob_hex: " | ".join(f.problems) for f in report.findings}
    assert "tree: missing kernels.bin" in problems[installed["tiny-graphs"].manifest.blob.hex]
    assert "tree: unexpected planted.so" in problems[installed["tiny-graphs"].manifest.blob.hex]
    assert "does not hash to its name" in problems[installed["other-graphs"].manifest.blob.hex]
    assert report.exit_code == 1 and report.ok == 1


def test_store_verify_fix_never_removes_a_tree_a_live_engine_holds(installed, home, capsys):
    bundle = installed["tiny-graphs"]
    with _Held(home, bundle) as held:  # held first: a lookup of a damaged tree moves it aside
        (tampered(_tree(home, bundle)) / "kernels.bin").write_bytes(b"damaged")
        code, out = _run(capsys, "store", "verify", "--fix", "--json")
        [finding] = json.loads(out)["findings"]
        assert code == 1 and finding["action"].startswith(f"kept: held by a live engine (pid {held.proc.pid})")
        assert _tree(home, bundle).is_dir()
    assert "removed" in _run(capsys, "store", "verify", "--fix")[1]
    assert not _tree(home, bundle).exists()


def test_store_rm_by_model_removes_all_its_bundles(installed, home, capsys):
    code, out = _run(capsys, "store", "rm", "tiny-llama", "--dry-run")
    assert code == 0 and "would remove 2 bundle(s)" in out and _tree(home, installed["tiny-graphs"]).is_dir()
    code, out = _run(capsys, "store", "rm", "tiny-llama", "--kind", "autotune", "--json")
    data = json.loads(out)
    assert code == 0 and [r["entries"][0]["kind"] for r in data["removed"]] == ["autotune"]
    assert data["freed_bytes"] > 0 and data["kept"] == [] and data["dry_run"] is False
    assert not _tree(home, installed["tiny-autotune"]).exists()
    assert Store().lookup("autotune", installed["tiny-autotune"].manifest.key_digest) is None
    assert _tree(home, installed["tiny-graphs"]).is_dir() and _tree(home, installed["other-graphs"]).is_dir()


def test_store_rm_by_key_or_blob_prefix_removes_exactly_that_bundle(installed, home, capsys):
    other = installed["other-graphs"].manifest
    assert _run(capsys, "store", "rm", other.key_digest[:12])[0] == 0
    assert not _tree(home, installed["other-graphs"]).exists()
    tiny = installed["tiny-graphs"].manifest
    assert _run(capsys, "store", "rm", tiny.blob.digest[:19])[0] == 0  # sha256: + 12 digits
    assert not _tree(home, installed["tiny-graphs"]).exists()


def test_store_rm_refuses_a_tree_a_live_engine_holds(installed, home, capsys):
    with _Held(home, installed["tiny-graphs"]) as held:
        code, out = _run(capsys, "store", "rm", "tiny-llama")
        assert code == 1
        assert f"KEPT {installed['tiny-graphs'].manifest.blob.hex[:12]}" in out and f"pid {held.proc.pid}" in out
        assert "stop it first" in out
        assert _tree(home, installed["tiny-graphs"]).is_dir()
        assert not _tree(home, installed["tiny-autotune"]).exists()  # the unheld one went


def test_store_rm_of_nothing_or_an_ambiguous_prefix_says_what_to_give(installed, home, capsys):
    assert main(["store", "rm", "no-such-model"]) == 2
    assert "give a model name or a key or blob digest prefix" in capsys.readouterr().err
    for tail in "12":  # two trees no index entry names (an install cut short), whose names share 'abcd'
        (home / "trees" / ("abcd" + tail * 60)).mkdir()
        record_install(home, "abcd" + tail * 60)  # installs record them before their blobs come
    assert main(["store", "rm", "abcd"]) == 2
    assert "abcd names 2 bundles" in capsys.readouterr().err
    assert main(["store", "rm", "abcd1"]) == 0 and not (home / "trees" / ("abcd" + "1" * 60)).exists()


def test_gc_dry_run_removes_nothing_and_says_what_would_go(installed, home, capsys):
    before = sorted(p.name for p in (home / "trees").iterdir())
    code, out = _run(capsys, "gc", "--max-size", "0", "--dry-run")
    assert code == 0 and "3 bundle(s) would be evicted (dry run)" in out
    assert sorted(p.name for p in (home / "trees").iterdir()) == before
    with _Held(home, installed["tiny-graphs"]):
        data = json.loads(_run(capsys, "gc", "--max-size", "0", "--dry-run", "--json")[1])
    assert data["dry_run"] is True and data["in_use"] == [installed["tiny-graphs"].manifest.blob.digest]
    assert len(data["evicted"]) == 2 and data["after_bytes"] > 0
    data = json.loads(_run(capsys, "gc", "--max-size", "0", "--json")[1])
    assert data["dry_run"] is False and len(data["evicted"]) == 3 and data["after_bytes"] == 0
