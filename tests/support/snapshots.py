"""A baked snapshot of tiny-llama for the snapshot tests: its recipe (tiny-llama's architecture,
one short sequence, weights written once as a checkpoint and mapped by the process), its bake, made
once a run for both snapshot modules, and `prebake serve` over it. CRIU comes from PREBAKE_CRIU (set
by .ci/run) or where host.py looks.

A snapshot's image names the files its process mapped by their paths (snapshot/files.py), so the
bake cannot be copied to another folder and still restore: both modules serve from the one store,
and tests/support/xdist_groups.py keeps them on one worker, one after the other, so no test sees
the other module's restores."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.support.baking import REPO, Home
from tests.support.once import once_per_run
from tests.support.serving import ServeProcess, serve_env

MODEL = "tiny-llama-snapshot"
PROMPT = list(range(1, 17))


def recipe_text() -> str:
    text = (REPO / "recipes" / "tiny-llama.toml").read_text()
    text = text.replace('name = "tiny-llama"', f'name = "{MODEL}"')
    text = text.replace('weights = "random"', 'weights = "random-checkpoint"')  # mapped from its file
    cut = text.replace("max_model_len = 128\nmax_num_seqs = 2\nmax_num_batched_tokens = 128\n",
                       "max_model_len = 64\nmax_num_seqs = 1\nmax_num_batched_tokens = 64\n")  # fmt: skip
    assert cut != text, "recipes/tiny-llama.toml's [serving] changed: update this copy"
    # two step shapes, not seven (PROMPT and its 8 tokens fit in 64); no autotune tactics: the
    # snapshot's subject is the dump and the restore, not the bucket set or the tactics
    text = re.sub(r"^tactics = .*$", "tactics = []", cut, flags=re.M)
    text = text.replace("[compile]\n", '[compile]\nvariant = "aoti-package"\n', 1)
    return text + "\n[snapshot]\nbake = true\n"


def criu_env() -> dict[str, str]:
    """PREBAKE_CRIU as the test process has it (serve_env drops every PREBAKE_ variable)."""
    return {"PREBAKE_CRIU": os.environ["PREBAKE_CRIU"]} if os.environ.get("PREBAKE_CRIU") else {}


def baked(tmp_path_factory: pytest.TempPathFactory) -> Home:
    """The snapshot recipe's bake, made once a run (support/once.py) by the first module that asks.
    A test that changes a file of it puts the bytes back before it ends."""
    root = once_per_run(tmp_path_factory, "snapshot-baked", bake)
    return Home(root, root / "recipes")


def bake(root: Path) -> Home:
    """`doit bake` of the snapshot recipe into a private home under `root`; fails the test if it fails."""
    from prebake.engine.bundled.snapshot.host import Able, can_snapshot

    able = can_snapshot()
    if not isinstance(able, Able):  # in CI a missing CRIU fails the run (.ci/run builds it)
        pytest.skip(f"no CRIU here: {able.reason}")
    recipes = root / "recipes"
    recipes.mkdir(parents=True)
    (recipes / f"{MODEL}.toml").write_text(recipe_text())
    home = Home(root, recipes)
    proc = home.doit("run", "bake", f"model={MODEL}", "precision=fp32", extra_env=criu_env())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "snapshot: published" in proc.stdout + proc.stderr
    return home


def serve(home: Home, *args: str, store: Path | None = None, **env: str) -> ServeProcess:
    """`prebake serve` of the snapshot recipe over `home`'s store, or over `store` (an empty one: the
    bundles come from --registry)."""
    environment = serve_env(store or home.root / "home", home.recipes, **{**criu_env(), **env})
    return ServeProcess(["--model", MODEL, "--precision", "fp32", *args], environment)


def greedy(server: ServeProcess, tokens: int = 8) -> list[int]:
    answer = server.complete(model=MODEL, prompt=PROMPT, max_tokens=tokens, temperature=0)
    return answer["choices"][0]["token_ids"]


def first_request_faults(server: ServeProcess) -> int:
    """The page faults (minor and major) of the process that serves, over its first request: its
    engine, the biggest process under `prebake serve` (a restored one runs under unshare and CRIU)."""
    pid = max(_descendants(server.proc.pid), key=lambda p: _stat(p)[21])  # rss, in pages
    before = _stat(pid)
    greedy(server)
    after = _stat(pid)
    return (after[7] - before[7]) + (after[9] - before[9])  # minflt, majflt


def _stat(pid: int) -> list[int]:
    """/proc/PID/stat's fields after the command's name, as numbers (index 0 is field 3, the state)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return [0, *map(int, fields[1:])]


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = _stat(int(entry.name))[1]
            except (OSError, IndexError):  # gone meanwhile
                continue
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += [child for child, parent in parents.items() if parent == current]
    return found


def registry_copy(home: Home, dest: Path) -> Path:
    """A copy of the bake's registry (a test that damages it damages its own)."""
    shutil.copytree(home.root / "home" / "registry", dest)
    return dest


def snapshot_entry(registry: Path) -> Path:
    (entry,) = (registry / "index" / "snapshot").glob("*.json")
    return entry


def snapshot_blob(registry: Path) -> Path:
    digest = json.loads(snapshot_entry(registry).read_text())["blob"]["digest"].split(":", 1)[1]
    (blob,) = (registry / "blobs" / "sha256").rglob(f"*{digest}*")
    return blob
