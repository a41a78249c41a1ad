"""A rolling upgrade: an older release of prebake and this one on one store at the same time, each in its
own venv (tests/support/releases.py: the last release before the store mark, 82225c8, and the one before
it, 13471a2). While each holds a tree, the other installs, reads and runs gc beside it: neither evicts
or damages what the other holds, and the store checks out whole after."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from prebake.artifacts.bundle.unpack import tree_problems
from tests.faults.checks import store_problems
from tests.operations.target import fetch_args, prebake, prebake_env, published_set
from tests.support.releases import RELEASES, release_python

ACTOR = Path(__file__).resolve().parents[1] / "support" / "store_actor.py"
ROUNDS = 2


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, tuple[Path, Path | None]]:
    cache = tmp_path_factory.mktemp("releases")
    built = {name: release_python(cache, commit) for name, commit in RELEASES.items()}
    return {"new": (Path(sys.executable), None), **built}


def _env(home: Path, code: Path | None) -> dict[str, str]:
    env = prebake_env(home)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    return env


def _actor(release: tuple[Path, Path | None], home: Path, *args: str, **popen) -> subprocess.Popen:
    python, code = release
    cwd = code or Path(__file__).resolve().parents[2]
    return subprocess.Popen([str(python), str(ACTOR), *args], env=_env(home, code), cwd=cwd, text=True, **popen)


def _hold(release, home: Path, registry: Path, manifest: Path) -> tuple[subprocess.Popen, Path]:
    holder = _actor(
        release,
        home,
        "hold",
        str(home),
        str(registry),
        str(manifest),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    line = holder.stdout.readline() if holder.stdout else ""
    assert line.startswith("held "), (line, holder.stderr.read() if holder.stderr else "")
    return holder, Path(line.split(" ", 1)[1].strip())


def _run(release, home: Path, *args: str) -> subprocess.CompletedProcess:
    actor = _actor(release, home, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = actor.communicate(timeout=300)
    return subprocess.CompletedProcess(actor.args, actor.returncode, out, err)


@pytest.mark.parametrize("old", list(RELEASES))
def test_an_old_and_the_new_release_at_once_never_evict_or_damage_what_the_other_holds(
    tmp_path, scenario, releases, old
):
    scenario.volume(f"two releases (new + {old})")
    registry, targets = published_set(tmp_path, scenario)
    home = tmp_path / "home"
    files = {}
    for kind, manifest in targets.manifests.items():
        files[kind] = tmp_path / f"{kind}.json"
        files[kind].write_bytes(manifest.to_bytes())
    assert prebake(*fetch_args(registry.root), env=prebake_env(home)).returncode == 0  # the new release installs

    old_holder, old_tree = _hold(releases[old], home, registry.root, files["graphs"])
    new_holder, new_tree = _hold(releases["new"], home, registry.root, files["buckets"])
    failures: list[str] = []

    def churn(release) -> None:
        for _ in range(ROUNDS):
            for args in (("gc", str(home)), ("install", str(home), str(registry.root), *map(str, files.values()))):
                done = _run(release, home, *args)
                if done.returncode != 0:
                    failures.append(f"{release[0]} {args[0]} exited {done.returncode}: {done.stderr[-600:]}")

    try:
        workers = [threading.Thread(target=churn, args=(releases[r],)) for r in (old, "new")]
        for w in workers:
            w.start()
        for w in workers:
            w.join(600)
        for tree, kind in ((old_tree, "graphs"), (new_tree, "buckets")):
            assert tree.is_dir() and not tree_problems(tree, targets.manifests[kind].files), (kind, tree)
    finally:
        for holder in (old_holder, new_holder):
            holder.communicate("", timeout=60)
    assert not failures, failures
    assert not store_problems(home)
    verified = prebake("store", "verify", env=prebake_env(home))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    again = prebake(*fetch_args(registry.root), env=prebake_env(home))
    assert again.returncode == 0, again.stderr
    _ = os
