"""The snapshot kind on this machine: baked by `doit bake`, restored by `prebake serve` in a new PID
namespace, answering as the usual start does; and the usual start when CRIU is absent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.snapshots import MODEL, baked, first_request_faults, greedy, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return baked(tmp_path_factory)  # shared with tests/faults/test_snapshot_faults.py


def test_serve_restores_the_snapshot_as_ready_as_the_usual_start_and_answers_alike(home):
    """As ready: its first request faults in no more pages than the usual start's. CRIU maps the
    files again without their pages, and the heap's trim gave back the steps' buffers; without
    the parked process mapping the first back and warming the second, this recipe's first request
    after a restore faulted 523 pages in, the usual start's 30; with them, 39 against 14."""
    restored = serve(home)
    try:
        restored.wait_ready(120)
        assert "restored from its snapshot" in restored.log
        assert "MB of mapped file pages made present again" in restored.log
        assert "prebake serve: snapshot: OpenMP waits " in restored.log  # chosen on this host, not the bake's
        restored_faults = first_request_faults(restored)
        tokens = greedy(restored)
    finally:
        assert restored.stop() == 0
    usual = serve(home, "--snapshot", "never")
    try:
        usual.wait_ready(300)
        assert "prebake serve: snapshot:" not in usual.log
        usual_faults = first_request_faults(usual)
        assert greedy(usual) == tokens  # fp32, greedy: the same tokens
    finally:
        usual.stop()
    assert restored_faults <= usual_faults + 100, (restored_faults, usual_faults)


def test_two_restores_of_one_image_serve_side_by_side(home):
    """Both restored (each in its own PID namespace, the carried files put back once with their modes,
    the shared run folder left to the sweep), on their own ports, serving the same tokens; twice, so
    the second pair puts back what the first pair's exit left ownerless."""
    for _ in range(2):
        first, second = serve(home), serve(home)
        try:
            first.wait_ready(300)
            second.wait_ready(300)
            for server in (first, second):
                assert "restored from its snapshot" in server.log, server.log[-3000:]
            assert first.port != second.port
            assert greedy(first) == greedy(second)
        finally:
            first.stop()
            second.stop()


def test_without_criu_the_start_falls_back_in_the_same_call_saying_why(home, tmp_path):
    server = serve(home, PREBAKE_CRIU=str(tmp_path / "no-criu"))
    try:
        server.wait_ready(300)
        assert "snapshot: not restored: no CRIU" in server.log
        assert "restored from its snapshot" not in server.log
        assert len(greedy(server)) == 8
    finally:
        server.stop()


def test_require_without_criu_exits_3_and_serves_nothing(home, tmp_path):
    server = serve(home, "--snapshot", "require", PREBAKE_CRIU=str(tmp_path / "no-criu"))
    assert server.wait_exit(120) == 3
    assert "--snapshot require: not starting otherwise" in server.log
    assert server.port is None


def test_fetch_installs_the_snapshot_and_names_its_tree(home):
    env = {**home.env, "PREBAKE_RECIPES": str(home.recipes)}
    done = subprocess.run(
        [sys.executable, "-m", "prebake.engine.cli", "fetch", "--model", MODEL, "--precision", "fp32", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert "PREBAKE_SNAPSHOT_TREE" in payload["env"]


def test_the_weights_are_recorded_and_checked_never_carried_in_the_bundle(home):
    """The checkpoint's files are checked at their paths on restore; the image never brings them."""
    (info,) = (home.root / "home" / "trees").rglob("snapshot.json")  # the bake's installed snapshot tree
    recorded = json.loads(info.read_text())
    assert any(f["path"].endswith(".safetensors") for f in recorded["files"])  # its one shard
    assert not any(f["path"].endswith(".safetensors") for f in recorded["carried"])
