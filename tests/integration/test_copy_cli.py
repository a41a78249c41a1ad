"""`prebake copy` as an operator runs it (real processes): a second run copies nothing and says so;
a copy killed with SIGKILL in the middle leaves only whole bundles, and a rerun copies what is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from prebake.registry.backends.file import FileRegistry
from tests.support.baking import BIN, REPO, Home
from tests.support.bundles import make_bundle

BUNDLES = 24


def _entries(registry: Path) -> list[Path]:
    return sorted((registry / "index").rglob("*.json")) if (registry / "index").exists() else []


def _staging(root: Path, count: int, payload_bytes: int) -> Path:
    registry = FileRegistry(root / "staging", create=True)
    for i in range(count):
        bundle = make_bundle(root / "bundles", model=f"model-{i:02d}", payload_bytes=payload_bytes)
        registry.publish(bundle.manifest, bundle.blob)
    return root / "staging"


def test_a_second_copy_moves_no_byte_and_says_so(tmp_path):
    staging, home = _staging(tmp_path, 3, 4096), Home(tmp_path)
    first = home.prebake("copy", str(staging), str(tmp_path / "production"), "--json")
    assert first.returncode == 0, first.stderr
    said = json.loads(first.stdout)
    assert said["copied"] == 3 and said["bytes_copied"] > 0 and said["revocation_list"] == "none at the source"
    again = home.prebake("copy", str(staging), str(tmp_path / "production"))
    assert again.returncode == 0, again.stderr
    assert "nothing to copy: all 3 bundle(s) already there, 0 bytes copied" in again.stdout
    narrowed = home.prebake("copy", str(staging), str(tmp_path / "one"), "--model", "model-01", "--json")
    assert [b["model"] for b in json.loads(narrowed.stdout)["bundles"]] == ["model-01"]


def test_a_copy_killed_midway_leaves_whole_bundles_and_a_rerun_copies_only_what_is_left(tmp_path):
    staging, home = _staging(tmp_path, BUNDLES, 3 << 20), Home(tmp_path)
    production = tmp_path / "production"
    proc = subprocess.Popen(
        [str(BIN / "prebake"), "copy", str(staging), str(production), "--json"],
        env=home.env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while len(_entries(production)) < 2:
        assert proc.poll() is None, (
            f"the copy ended before it could be killed: {proc.stderr.read() if proc.stderr else ''}"
        )
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.stderr:
        proc.stderr.close()
    before = len(_entries(production))
    assert 2 <= before < BUNDLES, before

    registry = FileRegistry(production)
    for m in registry.list():  # every entry there names a whole blob: blob first, entry last
        registry.fetch_blob(m.blob.digest, tmp_path / "check" / m.blob.hex, size=m.blob.size)

    rerun = home.prebake("copy", str(staging), str(production), "--json")
    assert rerun.returncode == 0, rerun.stderr
    said = json.loads(rerun.stdout)
    assert (said["copied"], said["already_there"]) == (BUNDLES - before, before)
    assert said["bytes_copied"] == sum(b["bytes"] for b in said["bundles"]) > 0
    assert len(_entries(production)) == BUNDLES
    last = json.loads(home.prebake("copy", str(staging), str(production), "--json").stdout)
    assert (last["copied"], last["bytes_copied"]) == (0, 0)
