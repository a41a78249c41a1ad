"""Small things that were still wrong answers: a tiny temperature (the schema allows 1e-40) samples
greedily instead of NaN's token 0, and a disk too full for serve's private copy of the graphs tree
is a short, clear error before the copy (or, when it fills during the copy, one line, not one per file)."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.common.probe import current_host
from prebake.engine.compose import plans_for
from prebake.registry.backends.file import FileRegistry
from tests.operations.conftest import OPS_MODEL
from tests.operations.target import synthetic
from tests.support.baking import BIN, REPO
from tests.support.serving import serve_env

PROMPT = [5, 17, 33, 2]


@pytest.fixture(scope="module")
def server(baked, tmp_path_factory):
    served = baked.serve(tmp_path_factory.mktemp("answers") / "home")
    served.wait_ready(300)
    yield served
    served.stop()


@pytest.mark.parametrize("temperature", [1e-40, 1e-38, 5e-324, 1e-7])
def test_a_tiny_temperature_answers_as_greedy_does(server, temperature):
    greedy = server.complete(prompt=PROMPT, max_tokens=12, temperature=0)["choices"][0]["token_ids"]
    tiny = server.complete(prompt=PROMPT, max_tokens=12, temperature=temperature, seed=3)["choices"][0]["token_ids"]
    assert tiny == greedy and len(set(tiny)) > 1, (tiny, greedy)


def test_a_tiny_top_p_answers_as_greedy_does(server):
    greedy = server.complete(prompt=PROMPT, max_tokens=12, temperature=0)["choices"][0]["token_ids"]
    assert (
        server.complete(prompt=PROMPT, max_tokens=12, temperature=1.0, top_p=1e-40)["choices"][0]["token_ids"] == greedy
    )


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


needs_mount_namespace = pytest.mark.skipif(
    not _unshare_works(), reason="needs `unshare -rm` (user and mount namespaces) for a private small tmpfs"
)


def _with_graphs(baked, tmp_path, monkeypatch, files: dict[str, bytes]):
    """The baked registry plus a graphs bundle (of `files`) under the recipe's compiled graphs key."""
    monkeypatch.setenv("PREBAKE_RECIPES", str(baked.recipes))
    plan = plans_for(load_recipe(OPS_MODEL), current_host())[0]
    shutil.copytree(baked.registry, tmp_path / "registry")
    registry = FileRegistry(tmp_path / "registry")
    manifest, blob = synthetic(tmp_path / "bake", plan.key("graphs"), files)
    registry.publish(manifest, blob)
    return registry


def _serve_on_a_small_tmp(baked, tmp_path, registry, mount_options: str) -> subprocess.CompletedProcess:
    """`prebake serve` (compiled, not eager) with the store's tmp/ on a private tmpfs of `mount_options`."""
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    script = (
        f'mount -t tmpfs -o {mount_options} tmpfs "{home}/tmp" && exec "{BIN / "prebake"}" serve --port 0 '
        f'--model {OPS_MODEL} --registry "{registry.root}" --on-miss fail'
    )
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        env=serve_env(home, baked.recipes),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_mount_namespace
def test_a_disk_too_small_for_the_private_graphs_copy_is_refused_before_the_copy_in_one_short_line(
    baked, tmp_path, monkeypatch
):
    registry = _with_graphs(baked, tmp_path, monkeypatch, {"big.bin": random.Random(0).randbytes(6 << 20)})
    got = _serve_on_a_small_tmp(baked, tmp_path, registry, "size=2m")
    log = got.stdout + got.stderr
    assert got.returncode == 2, log
    assert "needs 6.0 MiB" in log and "free; free space on that disk" in log, log
    assert max(len(line) for line in log.splitlines()) < 1000 and "Traceback" not in log


@needs_mount_namespace
def test_a_disk_that_fills_during_the_copy_is_one_short_line_not_one_per_file(baked, tmp_path, monkeypatch):
    files = {f"fxgraph/{i:04d}/entry.py": b"x" * 64 for i in range(600)}  # 1,200 files and folders
    registry = _with_graphs(baked, tmp_path, monkeypatch, files)
    got = _serve_on_a_small_tmp(baked, tmp_path, registry, "size=64m,nr_inodes=200")  # bytes enough, inodes not
    log = got.stdout + got.stderr
    assert got.returncode == 2, log
    assert "cannot copy" in log and "No space left on device" in log and "more file(s)" in log, log
    assert max(len(line) for line in log.splitlines()) < 1000 and "Traceback" not in log
