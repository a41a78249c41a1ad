"""A bounded store: the bound holds after every install, gc evicts least recently used bundles,
and a tree a running process holds survives every gc until that process dies."""

from __future__ import annotations

import signal
import subprocess
import sys

from prebake.registry.backends.file import FileRegistry
from tests.faults.checks import tree_problems
from tests.faults.procs import REPO, actor, child_env, result, unbounded, wait_for

PAYLOAD = 256 << 10  # incompressible: a bundle takes about 512 KiB in the store (blob + tree)


def _registry_of(tmp_path, scenario, in_force, *models: str):
    registry = FileRegistry(tmp_path / "registry")
    bundles = [in_force.bundle(tmp_path / "bake", model=m, payload_bytes=PAYLOAD) for m in models]
    for b in bundles:
        registry.publish(b.manifest, b.blob)
    scenario.registry(registry, *(b.manifest for b in bundles))
    return registry, bundles


def _store_bytes(home) -> int:
    return sum(p.lstat().st_size for sub in ("blobs", "trees") for p in (home / sub).rglob("*") if not p.is_dir())


def _gc(home, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prebake.engine.cli", "gc", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=child_env(PREBAKE_HOME=str(home), **(env or {})),
        timeout=60,
    )


def test_the_store_bound_holds_after_every_install_by_separate_processes(tmp_path, scenario, in_force):
    registry, bundles = _registry_of(tmp_path, scenario, in_force, "a", "b", "c")
    home = scenario.store(tmp_path / "home")
    bound = 3 * PAYLOAD  # one bundle and a half
    for bundle in bundles:
        got = result(
            actor(
                "fetch",
                "--home",
                str(home),
                "--registry",
                str(registry.root),
                "--key",
                bundle.manifest.key_digest,
                env={"PREBAKE_STORE_MAX_BYTES": str(bound)},
            )
        )
        assert got["problems"] == []
        assert _store_bytes(home) <= bound
    store = unbounded(home)
    assert [store.lookup("graphs", b.manifest.key_digest) is not None for b in bundles] == [False, False, True]


def test_gc_evicts_the_least_recently_used_and_never_a_tree_a_running_process_holds(tmp_path, scenario, in_force):
    registry, (held, old, recent) = _registry_of(tmp_path, scenario, in_force, "held", "old", "recent")
    home = scenario.store(tmp_path / "home")
    common = ["--home", str(home), "--registry", str(registry.root)]
    ready = tmp_path / "ready"
    holder = actor("hold", *common, "--key", held.manifest.key_digest, "--ready", str(ready))
    try:
        wait_for(ready, holder)
        for bundle in (old, recent):
            result(actor("fetch", *common, "--key", bundle.manifest.key_digest))
        one_bundle = _store_bytes(home) // 3

        first = _gc(home, "--max-size", str(2 * one_bundle + one_bundle // 2))
        assert first.returncode == 0, first.stderr
        store = unbounded(home)
        # the held tree is the least recently used of all (held before the others were fetched): skipped
        assert f"in use  {held.manifest.blob.hex[:16]}" in first.stdout
        assert store.lookup("graphs", old.manifest.key_digest) is None, "the least recently used free one went first"
        assert store.lookup("graphs", recent.manifest.key_digest) is not None

        emptied = _gc(home, "--max-size", "0")
        assert emptied.returncode == 0, emptied.stderr
        assert f"in use  {held.manifest.blob.hex[:16]}" in emptied.stdout and "still above the bound" in emptied.stdout
        kept = store.lookup("graphs", held.manifest.key_digest)
        assert kept is not None and tree_problems(kept.tree, held.manifest) == []
        assert store.lookup("graphs", recent.manifest.key_digest) is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)

    after_death = _gc(home, "--max-size", "0")  # the kernel dropped the dead holder's lock
    assert after_death.returncode == 0 and "1 bundle(s) evicted" in after_death.stdout, after_death.stdout
    assert _store_bytes(home) == 0


def test_a_bound_from_the_environment_is_what_plain_prebake_gc_enforces(tmp_path, scenario, in_force):
    registry, bundles = _registry_of(tmp_path, scenario, in_force, "a", "b")
    home = scenario.store(tmp_path / "home")
    for bundle in bundles:
        result(
            actor("fetch", "--home", str(home), "--registry", str(registry.root), "--key", bundle.manifest.key_digest)
        )
    done = _gc(home, env={"PREBAKE_STORE_MAX_BYTES": "600K"})
    assert done.returncode == 0, done.stderr
    assert "1 bundle(s) evicted" in done.stdout and _store_bytes(home) <= 600 << 10
