"""The store on the volumes it really lives on: a disk that fills (a small tmpfs mounted by the test),
a read-only mount, one tmpfs seen from two mount namespaces. Each scenario runs `prebake` as an
operator would on a real mount (tests/support/mounts.py; root, as CI runs), and names its volume
in the fault tally's summary line (tests/support/scenarios.py)."""

from __future__ import annotations

import errno
import json
import logging
import shutil
import subprocess
import sys
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


def _snapshot(home: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(home)): (p.lstat().st_mtime_ns, p.lstat().st_size) for p in home.rglob("*")}


def _read_only_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "read-only" in line]


def test_fetch_from_a_read_only_store_installs_nothing_writes_nothing_and_says_so_once(tmp_path, scenario):
    scenario.volume("read-only mount")
    registry, targets = published_set(tmp_path, scenario)
    with mounts.tmpfs(tmp_path / "disk", targets.bytes * 4) as disk:
        home = disk / "store"
        filled = prebake(*fetch_args(registry.root), env=prebake_env(home))  # the job that fills the volume
        assert filled.returncode == EXIT_OK, filled.stderr
        before = _snapshot(home)
        with mounts.read_only(disk):
            got = prebake(*fetch_args(registry.root, "--json"), env=prebake_env(home))

            assert got.returncode == EXIT_OK, got.stdout + got.stderr
            assert json.loads(got.stdout)["complete"]
            assert len(_read_only_lines(got.stderr)) == 1, got.stderr  # one warning line, not one per write
            assert _snapshot(home) == before  # not a lease, a stats line, a lock or a scratch folder

            gc = prebake("store", "gc", "--max-size", "0", env=prebake_env(home))
            assert gc.returncode == 5 and "read-only" in gc.stderr, gc.stdout + gc.stderr
        _assert_clean(home)


def test_a_miss_on_a_read_only_store_says_the_store_is_read_only(tmp_path, scenario):
    scenario.volume("read-only mount")
    registry, targets = published_set(tmp_path, scenario)
    with mounts.tmpfs(tmp_path / "disk", targets.bytes * 4) as disk:
        home = disk / "store"
        assert prebake(*fetch_args(registry.root), env=prebake_env(home)).returncode == EXIT_OK
        graphs = targets.manifests["graphs"]
        (home / "index" / "graphs" / f"{graphs.key_digest}.json").unlink()  # this volume was filled without it
        with mounts.read_only(disk):
            got = prebake(*fetch_args(registry.root), env=prebake_env(home))

        assert got.returncode == 3, got.stdout + got.stderr  # a miss, not a crash on the first write
        miss = next(line for line in got.stderr.splitlines() if line.startswith("miss: graphs"))
        assert "read-only" in miss and "fill it from a writer" in miss, got.stderr


def _fill(disk: Path) -> Path:
    """Fill `disk` to its last byte, as a node's log or image pulls would."""
    filler = disk / "filler"
    done = subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, text=True)
    assert "No space left" in done.stderr, done.stderr
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1", "oflag=append", "conv=notrunc"], capture_output=True)
    return filler


def _serves(server) -> None:
    try:
        server.wait_ready(600)
        assert server.complete(prompt=[1, 2, 3], max_tokens=3, temperature=0)["choices"][0]["token_ids"]
    finally:
        server.stop()


def _other_model(baked, tmp_path: Path, home: Path):
    """`prebake serve --eager --write-back` of a model nothing was baked for, from `home` and the
    baked registry: every kind misses and is built in place."""
    from tests.support.api_server import write_api_recipe
    from tests.support.serving import ServeProcess, serve_env

    recipes = write_api_recipe(tmp_path / "other-recipes", "ops-other")
    registry = tmp_path / "registry-copy"  # written back to: the session's baked registry stays as it is
    if not registry.exists():
        shutil.copytree(baked.registry, registry)
    args = ["--model", "ops-other", "--eager", "--registry", str(registry), "--write-back"]
    return ServeProcess(args, serve_env(home, recipes, PREBAKE_WRITE_BACK="index"))


def _installed(baked, home: Path) -> Path:
    """`home` holding the baked recipe's bundles, installed by a first start."""
    first = baked.serve(home)
    first.wait_ready(600)
    first.stop()
    return home


def _warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if "WARNING" in line and "PREBAKE_TRUSTED_KEYS" not in line]


@pytest.mark.slow
def test_serve_on_a_full_disk_starts_from_what_is_installed_and_builds_a_miss_elsewhere(baked, tmp_path, scenario):
    scenario.volume("tmpfs (full)")
    with mounts.tmpfs(tmp_path / "disk", 64 << 20) as disk:
        home = _installed(baked, disk / "store")
        _fill(disk)

        hit = baked.serve(home)
        _serves(hit)
        assert "miss:" not in hit.log and len(_warnings(hit.log)) <= 2, _warnings(hit.log)  # stats; scratch

        miss = _other_model(baked, tmp_path, home)  # nothing baked for it: both kinds miss, on the full disk
        _serves(miss)
        assert "in place" in miss.log and "nearly full" in miss.log, miss.log  # built in a scratch elsewhere
        _assert_clean(home)

        fresh = baked.serve(disk / "store-2")  # a new store cannot even be marked: its own exit code
        assert fresh.wait_exit(300) == EXIT_FULL and "is full" in fresh.log, fresh.log


@pytest.mark.slow
def test_serve_from_a_read_only_store_writes_nothing_and_a_miss_builds_in_a_scratch_elsewhere(
    baked, tmp_path, scenario
):
    scenario.volume("read-only mount")
    with mounts.tmpfs(tmp_path / "disk", 64 << 20) as disk:
        home = _installed(baked, disk / "store")
        before = _snapshot(disk)
        with mounts.read_only(disk):
            hit = baked.serve(home)
            _serves(hit)
            assert "miss:" not in hit.log and len(_read_only_lines(hit.log)) == 1, hit.log

            miss = _other_model(baked, tmp_path, home)
            _serves(miss)
            assert "read-only" in miss.log and "in place" in miss.log, miss.log
            assert _snapshot(disk) == before


ACTOR = Path(__file__).resolve().parents[1] / "support" / "store_actor.py"


def _manifest_file(tmp_path: Path, manifest) -> str:
    path = tmp_path / f"{manifest.kind}.manifest.json"
    path.write_bytes(manifest.to_bytes())
    return str(path)


def test_a_tree_held_from_another_mount_namespace_survives_a_gc_here(tmp_path, scenario):
    """Two nodes mounting one volume, as far as one machine shows it: one tmpfs seen through two mount
    namespaces at two paths (unshare -m). flock is the filesystem's, so the lease holds across them."""
    scenario.volume("tmpfs (two mount namespaces)")
    registry, targets = published_set(tmp_path, scenario)
    graphs = targets.manifests["graphs"]
    with mounts.tmpfs(tmp_path / "disk", targets.bytes * 4) as disk:
        home = disk / "store"
        assert prebake(*fetch_args(registry.root), env=prebake_env(home)).returncode == EXIT_OK
        other = tmp_path / "other-node"
        other.mkdir()
        script = (
            f"mount --bind {disk} {other} && exec {sys.executable} {ACTOR} hold {other / 'store'} "
            f"{registry.root} {_manifest_file(tmp_path, graphs)}"
        )
        node = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = node.stdout.readline() if node.stdout else ""
            assert line.startswith(f"held {other / 'store'}"), line
            assert not (other / "store").exists()  # the bind mount is the other namespace's alone

            gc = prebake("store", "gc", "--max-size", "0", "--json", env=prebake_env(home))

            assert gc.returncode == EXIT_OK, gc.stderr
            report = json.loads(gc.stdout)
            assert report["in_use"] == [graphs.blob.digest], report
            assert (home / "trees" / graphs.blob.hex).is_dir()
        finally:
            node.communicate("", timeout=60)
        again = json.loads(prebake("store", "gc", "--max-size", "0", "--json", env=prebake_env(home)).stdout)
        assert graphs.blob.digest in again["evicted"], again
        _assert_clean(home)


def test_a_lease_the_full_disk_cannot_make_is_one_warning_and_taken_once_space_is_freed(tmp_path, scenario, caplog):
    """A lease file is made when the tree is first held; on a disk out of room for one more file (a
    tmpfs out of inodes: an empty file needs no blocks), serving goes on unleased, with one warning."""
    from prebake.artifacts.store.leases import hold, lease_file
    from prebake.artifacts.store.paths import StorePaths

    scenario.volume("tmpfs (full)")
    with mounts.tmpfs(tmp_path / "disk", 1 << 20, inodes=64) as disk:
        paths, hexd = StorePaths(disk / "store"), "ab" * 32
        lease_file(paths, hexd)  # its folder, as install leaves it
        with pytest.raises(OSError) as full:
            for n in range(100):
                (disk / f"filler-{n}").touch()
        assert full.value.errno == errno.ENOSPC
        with caplog.at_level(logging.WARNING, logger="prebake.store"):
            assert hold(paths, hexd) is None
            assert hold(paths, hexd) is None
        warned = [r.getMessage() for r in caplog.records if "cannot hold a lease" in r.getMessage()]
        assert len(warned) == 1 and "(read-only or full)" in warned[0], caplog.text
        (disk / "filler-0").unlink()
        lease = hold(paths, hexd)
        assert lease is not None and paths.lease(hexd).exists()
        lease.release()
