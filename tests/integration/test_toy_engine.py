"""A new engine is one adapter registered in one line: the toy engine (tests/support/toy_engine.py),
with its own software factor and recipe setting, bakes through doit, misses on its own factor with
the factor named, and is fetched and served through the shared starter; no other file knows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain

from prebake.artifacts.bake.tasks import BakeRequest, bake_tasks
from prebake.artifacts.errors import RecipeError
from prebake.artifacts.recipe.schema import load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine import adapters
from prebake.engine.common import probe as probing
from prebake.engine.common import starter
from prebake.engine.common.adapter import StartRequest
from prebake.engine.compose import Context
from prebake.registry import open_registry
from tests.support.baking import REPO
from tests.support.toy_engine import ToyEngine

RECIPE = """\
[model]
name = "toy-model"
engine = "toy"
[model.config]
vocab_size = 64
hidden_size = 32
num_hidden_layers = 1
num_attention_heads = 2
max_position_embeddings = 64
[engine]
flavour = "{flavour}"
[serving]
max_model_len = 64
max_num_seqs = 2
max_num_batched_tokens = 64
block_size = 16
[matrix]
platform = ["cpu"]
dtype = ["fp32"]
"""
REGISTER = "from prebake.engine.adapters import register; from tests.support.toy_engine import ToyEngine; register(ToyEngine())"


def _site(root: Path, version: str) -> Path:
    """A folder where the toy-runtime package is installed at `version` (its metadata is what the probe reads)."""
    info = root / f"toy_runtime-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: toy-runtime\nVersion: {version}\n")
    return root


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy engine registered (the one line), undone afterwards; its recipe in a recipe folder."""
    monkeypatch.setattr(adapters, "ADAPTERS", dict(adapters.ADAPTERS))
    monkeypatch.setattr(probing, "_DECLARED", dict(probing._DECLARED))
    adapters.register(ToyEngine())  # the one line a new engine takes
    yield
    probing.current_host.cache_clear()


def _recipes(folder: Path, flavour: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "toy-model.toml").write_text(RECIPE.format(flavour=flavour))
    return folder


def test_a_toy_engine_bakes_misses_on_its_own_factor_and_serves(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("PREBAKE_RECIPES", str(_recipes(tmp_path / "recipes", "sweet")))
    monkeypatch.chdir(tmp_path)
    v1 = _site(tmp_path / "site-1.0", "1.0")
    registry_dir = tmp_path / "registry"
    host = probing.probe(metadata_path=[str(v1), *sys.path])
    baker = Context(Store(tmp_path / "baker-home"), host, str(registry_dir), creating=True)

    loader = ModuleTaskLoader(
        {
            "task_bake": lambda: bake_tasks(BakeRequest("toy-model"), open_baker=lambda _registry: baker),
            "DOIT_CONFIG": {"dep_file": str(tmp_path / "doit.db")},
        }
    )
    assert DoitMain(loader).run(["run", "bake"]) == 0
    listed = {m.kind: m for m in open_registry(registry_dir).list()}
    assert set(listed) == {"buckets", "toycache"}
    assert listed["toycache"].key["software"]["toy_runtime"] == "1.0"  # its own factor, in its own key
    assert listed["toycache"].key["toy"] == {"flavour": "sweet"}  # its own recipe setting

    # another host with toy-runtime 2.0 misses, and the miss names the toy's factor
    v2 = _site(tmp_path / "site-2.0", "2.0")
    other = Context(
        Store(tmp_path / "other-home"), probing.probe(metadata_path=[str(v2), *sys.path]), str(registry_dir)
    )
    plan = other.pick_plan(load_recipe("toy-model"))
    with other.holds:
        missed = other.resolve(plan)
    (miss,) = missed.misses
    assert miss.key.kind == "toycache" and miss.differing == {"software.toy_runtime": ("2.0", "1.0")}
    assert "software.toy_runtime: 2.0 here, 1.0 there" in miss.explain()

    # fetch and serve from the baked cache, in a process of its own where the same line registers it
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(v1), str(REPO)]),
        "PREBAKE_HOME": str(tmp_path / "server-home"),
        "PREBAKE_REGISTRY": str(registry_dir),
    }
    cli = f"{REGISTER}; from prebake.engine.cli import main; raise SystemExit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", f"import sys; {cli}"]
    fetched = subprocess.run([*command, "fetch", "--engine", "toy", "--model", "toy-model"], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert "export TOY_CACHE_DIR=" in fetched.stdout and "# toy: " in fetched.stdout
    served = subprocess.run([*command, "serve", "--engine", "toy", "--model", "toy-model"], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert served.returncode == 0, served.stderr
    assert 'toy serving {"decode_buckets": ' in served.stdout and '"flavour": "sweet"' in served.stdout

    # a miss under --write-back: the shared starter watches the server and publishes what it compiled
    env["PREBAKE_RECIPES"] = str(_recipes(tmp_path / "salty", "salty"))
    wrote = subprocess.run([*command, "serve", "--engine", "toy", "--model", "toy-model", "--write-back"], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    assert "toycache: published" in wrote.stderr, wrote.stderr
    (waiting,) = open_registry(registry_dir / "incoming").list("toycache")
    assert waiting.key["toy"] == {"flavour": "salty"}

    # the engine's options and settings are its own to check
    refused = subprocess.run([*command, "serve", "--engine", "toy", "--model", "toy-model", "--eager"], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and "--eager: not an option of engine 'toy'" in refused.stderr
    # its own option: a flag the CLI built from its EngineSpec, which reaches its server
    fraction = subprocess.run([*command, "serve", "--engine", "toy", "--model", "toy-model", "--mem-fraction-static", "0.8"],
                              env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert fraction.returncode == 0 and "mem 0.8" in fraction.stdout, fraction.stderr
    wide = {**env, "COLUMNS": "400"}  # one help line per flag
    helped = subprocess.run([*command, "serve", "--help"], env=wide, capture_output=True, text=True, timeout=120)
    assert "--mem-fraction-static" in helped.stdout and "with --engine toy: the share of memory" in helped.stdout
    other = subprocess.run([*command, "serve", "--model", "toy-model", "--mem-fraction-static", "0.8"], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert other.returncode == 2 and "--mem-fraction-static: not an option of engine 'prebake'" in other.stderr


def test_a_recipe_setting_the_toy_does_not_take_is_refused_naming_it(toy, tmp_path, monkeypatch):
    folder = _recipes(tmp_path / "recipes", "sweet")
    (folder / "toy-model.toml").write_text(RECIPE.format(flavour="sweet").replace("[engine]", "[engine]\nspice = 1"))
    recipe = load_recipe(folder / "toy-model.toml")
    with pytest.raises(RecipeError, match=r"\[engine\] settings for 'toy': spice: Extra inputs are not permitted"):
        adapters.adapter_for(recipe)
    unknown = recipe.model_copy(update={"model": recipe.model.model_copy(update={"engine": "sglang"})})
    with pytest.raises(RecipeError, match=r"names engine 'sglang'; prebake serves \['prebake', 'toy', 'vllm'\]"):
        adapters.adapter_for(unknown)


class _Steps:
    """A start's step log that keeps each step's name and detail, and the notes."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str]] = []
        self.notes: list[str] = []

    @contextmanager
    def step(self, name: str):
        record = SimpleNamespace(detail="")
        yield record
        self.steps.append((name, record.detail))

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass
class _InProcess:
    """A runner that serves the toy's cache in this process: the starter's other kind of run."""

    ran: list[dict] = field(default_factory=list)
    abandoned: list[Path] = field(default_factory=list)

    def begin(self, plan, services) -> starter.Begun:
        run_dir = services.store.home / "run"
        return starter.Begun(plan.kinds.names, run_dir, services.holds, lambda: self.abandoned.append(run_dir))

    def run(self, started: starter.Started) -> dict:
        served = json.loads((started.installed["toycache"].tree / "toy-cache.json").read_text())
        self.ran.append(served)
        return served


def test_the_shared_starter_runs_an_engine_in_this_process_through_a_runner_of_its_own(toy, tmp_path, monkeypatch):
    """The bundled engine's way (a runner that serves in this process), on the toy: the same steps,
    the same miss policy, which refuses before the engine runs and undoes what the runner began."""
    monkeypatch.setenv("PREBAKE_RECIPES", str(_recipes(tmp_path / "recipes", "sweet")))
    registry_dir = tmp_path / "registry"
    host = probing.probe(metadata_path=[str(_site(tmp_path / "site-1.0", "1.0")), *sys.path])
    baker = Context(Store(tmp_path / "baker-home"), host, str(registry_dir), creating=True)
    plan = baker.pick_plan(load_recipe("toy-model"))
    for kind in plan.kinds.names:
        baker.bake(plan, kind)

    runner, log = _InProcess(), _Steps()
    node = Context(Store(tmp_path / "node-home"), host, str(registry_dir))
    with node.holds:
        served = starter.start(runner, StartRequest(model="toy-model", engine="toy"), lambda: node, log)
    assert served["flavour"] == "sweet" and runner.ran == [served] and not runner.abandoned
    assert [name for name, _ in log.steps] == ["probe", "keys", "lookup", "verify", "fetch"]
    assert dict(log.steps)["lookup"].startswith("buckets in the registry, toycache in the registry")

    # toy-runtime 2.0 misses the toycache: under --on-miss fail the starter refuses before the run
    other = probing.probe(metadata_path=[str(_site(tmp_path / "site-2.0", "2.0")), *sys.path])
    moved = Context(Store(tmp_path / "moved-home"), other, str(registry_dir))
    request = StartRequest(model="toy-model", engine="toy", on_miss="fail")
    with moved.holds, pytest.raises(starter.MissRefused, match="--on-miss is fail") as refused:
        starter.start(runner, request, lambda: moved, _Steps())
    assert refused.value.code == 3 and len(runner.ran) == 1
    assert runner.abandoned == [tmp_path / "moved-home" / "run"]
