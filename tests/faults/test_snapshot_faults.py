"""Faults of the snapshot kind: a tampered, truncated or foreign image, a restore killed half-way,
weights that changed since the bake. Each is refused or fallen back from in the same call, with
one line saying why, and what is served answers as the usual start does."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.snapshots import baked, greedy, registry_copy, serve, snapshot_blob, snapshot_entry

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return baked(tmp_path_factory)  # shared with tests/integration/test_snapshot.py


@pytest.fixture(scope="module")
def usual_tokens(home):
    server = serve(home, "--snapshot", "never")
    try:
        server.wait_ready(300)
        return greedy(server)
    finally:
        server.stop()


def _falls_back(home, registry: Path, store: Path, expected: list[int], why: str) -> None:
    server = serve(home, "--registry", str(registry), store=store)
    try:
        server.wait_ready(300)
        assert "prebake serve: snapshot: not restored:" in server.log
        assert why in server.log, server.log
        assert "restored from its snapshot" not in server.log
        assert greedy(server) == expected
    finally:
        server.stop()


def test_a_tampered_image_is_refused_and_the_usual_start_serves(home, usual_tokens, tmp_path):
    registry = registry_copy(home, tmp_path / "registry")
    blob = snapshot_blob(registry)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    _falls_back(home, registry, tmp_path / "store", usual_tokens, "it is corrupt")


def test_a_truncated_image_is_refused_and_the_usual_start_serves(home, usual_tokens, tmp_path):
    registry = registry_copy(home, tmp_path / "registry")
    blob = snapshot_blob(registry)
    with blob.open("r+b") as f:
        f.truncate(blob.stat().st_size // 2)
    _falls_back(home, registry, tmp_path / "store", usual_tokens, "fetching blob")


def test_a_snapshot_of_another_build_is_refused(home, usual_tokens, tmp_path):
    registry = registry_copy(home, tmp_path / "registry")
    entry = snapshot_entry(registry)
    manifest = json.loads(entry.read_text())
    manifest["key"]["snapshot"]["kernel"] = "5.10.0-another-host"  # its image, filed under this host's key
    entry.write_text(json.dumps(manifest))
    _falls_back(home, registry, tmp_path / "store", usual_tokens, "its entry was refused")


def test_a_restore_killed_half_way_leaves_nothing_running_and_the_next_one_restores(home, usual_tokens):
    server = serve(home)
    server.wait_line("snapshot: restoring", 120)
    server.proc.send_signal(signal.SIGKILL)
    server.wait_exit(60)
    _wait_until_no_restore_runs(home)
    again = serve(home)
    try:
        again.wait_ready(120)
        assert "restored from its snapshot" in again.log
        assert greedy(again) == usual_tokens
    finally:
        again.stop()


def test_a_sigterm_as_it_restores_stops_the_start_serving_nothing_and_leaving_nothing_running(home):
    """The operator's stop, come while CRIU restores: the restore is killed, no usual start follows,
    and the command exits as a stopped server does (before, the default action killed `prebake
    serve` and left the restore to finish and stop on its own)."""
    server = serve(home)
    deadline = time.monotonic() + 120
    while "snapshot: restoring" not in server.log:  # polled closely: CRIU is still at work when it comes
        assert time.monotonic() < deadline and server.proc.poll() is None, server.log
        time.sleep(0.001)
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(60) == 128 + 15, server.log  # with the line below once CRIU had started
    assert "ready:" not in server.log and "starting from the bundles" not in server.log, server.log
    _wait_until_no_restore_runs(home, bound=5)


def test_weights_changed_since_the_bake_fall_back_naming_the_file(home, tmp_path):
    """Last in the module: it changes the bake's checkpoint, and puts its bytes back at the end (the
    bake is shared with tests/integration/test_snapshot.py, and a restore maps the file at its path)."""
    (weights,) = (home.root / "home").rglob("*.safetensors")
    original = weights.read_bytes()
    data = bytearray(original)
    data[-8] ^= 0x01  # the last tensor's last bytes: the file keeps its size, its digest changes
    weights.write_bytes(bytes(data))
    try:
        server = serve(home)
        try:
            server.wait_ready(300)
            assert f"this host's files differ from the bake's: {weights} has other bytes here" in server.log
            assert "restored from its snapshot" not in server.log
            assert len(greedy(server)) == 8
        finally:
            server.stop()
    finally:
        weights.write_bytes(original)


def _wait_until_no_restore_runs(home, bound: float = 60) -> None:
    """Every process of the killed restore gone: no `criu restore` of this store's image, no parked
    process of this bake (its environment names the bake's store)."""
    store = str(home.root / "home")
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        running = [pid for pid in _pids() if _of_this_restore(pid, store)]
        if not running:
            return
        time.sleep(0.2)
    raise AssertionError(f"processes of the killed restore still run: {running}")


def _of_this_restore(pid: int, store: str) -> bool:
    command = _cmdline(pid)
    if "criu" in command and " restore " in command:
        return store in command
    if "--park" in command:
        return store in _read(f"/proc/{pid}/environ")
    return False


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline")


def _read(path: str) -> str:
    try:
        return Path(path).read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
