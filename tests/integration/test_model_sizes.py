"""Models of real widths on this CPU, through reduced copies (the full 1B and 8B run in benchmarks/scale.py):
a graphs bake of the 1B's widths materializes none of its weights, and the 1B recipe's path (a random
checkpoint written once, read by mmap, a package baked on placeholders) bakes and serves."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.adapter import child_env
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.weights import LlamaConfig, parameter_shapes
from tests.support.baking import Home
from tests.support.serving import ServeProcess, serve_env

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ONE_B = (REPO / "recipes" / "llama3.2-1b.toml").read_text()
# Two step shapes (a prefill of 128 tokens, a decode over 128): a minute or two of compiling per shape.
SMALL_LIMITS = "max_model_len = 128\nmax_num_seqs = 1\nmax_num_batched_tokens = 128\nblock_size = 128\n"


def _reduced_1b(folder: Path, name: str, *, layers: int, dtype: str = "bf16") -> Path:
    """The 1B recipe cut to `layers` layers of its widths, small serving limits, a one-run autotune."""
    text = ONE_B.replace('name = "llama3.2-1b"', f'name = "{name}"')
    text = text.replace("num_hidden_layers = 16", f"num_hidden_layers = {layers}")
    text = re.sub(
        r"max_model_len = \d+\nmax_num_seqs = \d+\nmax_num_batched_tokens = \d+\nblock_size = \d+\n", SMALL_LIMITS, text
    )
    text = re.sub(
        r"\[autotune\].*?\n\n", "[autotune]\ntactics = []\nwarmup = 0\niterations = 1\nlayers = 1\n\n", text, flags=re.S
    )
    text = text.replace('dtype = ["bf16"]', f'dtype = ["{dtype}"]')
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(text)
    return folder / f"{name}.toml"


def test_a_graphs_bake_of_the_1b_widths_materializes_none_of_its_weights(tmp_path):
    recipe_path = _reduced_1b(tmp_path / "recipes", "mid-llama", layers=2, dtype="fp32")
    recipe = load_recipe(recipe_path)
    weights = 4 * sum(n for n in map(_numel, parameter_shapes(LlamaConfig.from_hf(recipe.model.config)).values()))
    decode = StepShape("decode", 1, 1, 128)  # one shape: the bound is about weights, not shapes
    buckets, autotune, out = tmp_path / "buckets", tmp_path / "autotune", tmp_path / "graphs"
    for folder in (buckets, autotune, out):
        folder.mkdir()
    bucket_set = {"version": 1, "strategy": "exponential", "block_size": 128, "prompt": [], "decode": [[1, 1, 1]]}
    (buckets / "buckets.json").write_text(json.dumps(bucket_set))
    winner = {"shape": asdict(decode), "timings_ms": {}, "winner": {"attn_impl": "sdpa", "threads": 0}}
    (autotune / "autotune.json").write_text(json.dumps({"tactics": {}, "shapes": [winner]}))
    request = tmp_path / "graphs-request.json"
    request.write_text(
        json.dumps(
            {
                "kind": "graphs",
                "recipe": recipe.model_dump(mode="json"),
                "target": {"platform": "cpu", "tp": 1, "dtype": "fp32"},
                "inputs": {"buckets": str(buckets), "autotune": str(autotune)},
                "out": str(out),
            }
        )
    )
    env = child_env("graphs", out, {**serve_env(tmp_path / "home")})
    done = subprocess.run(
        [sys.executable, "-m", "prebake.engine.bundled.build", str(request)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    builder = json.loads((out / "graphs.json").read_text())["builder"]
    assert builder["weights"] == "placeholders"
    # 1.5 GB of fp32 weights declared; the bake's process peaks at torch, Inductor and the graph alone
    assert builder["peak_rss_bytes"] < weights / 2, (builder, weights)
    assert not (tmp_path / "home" / "models").exists()  # and no checkpoint was written for it


def test_the_1b_path_bakes_on_placeholders_and_serves_from_its_checkpoint_written_once(tmp_path):
    name = "llama3.2-1b-cut"
    recipes = _reduced_1b(tmp_path / "recipes", name, layers=2).parent
    home = Home(tmp_path / "bake")
    baked = home.doit("run", "bake", f"model={name}", "precision=bf16", extra_env={"PREBAKE_RECIPES": str(recipes)})
    assert baked.returncode == 0, baked.stdout + baked.stderr
    assert not (tmp_path / "bake" / "home" / "models").exists()  # the bake wrote no checkpoint
    registry = tmp_path / "bake" / "home" / "registry"
    serving = tmp_path / "serve"
    first = _serve(name, registry, serving, recipes)
    assert "random checkpoint once" in first.log and "compile" not in _steps(first.log)
    [folder] = (serving / "models" / name).glob("[0-9a-f]*[0-9a-f]")
    files = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert any(n.endswith(".safetensors") for n in files) and "model.safetensors.index.json" in files
    second = _serve(name, registry, serving, recipes)
    assert "random checkpoint" not in second.log  # read, not written
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == files
    assert first.tokens == second.tokens and first.tokens  # the same greedy tokens from the same weights


class _Served:
    def __init__(self, log: str, tokens: list[int]):
        self.log, self.tokens = log, tokens


def _serve(name: str, registry: Path, home: Path, recipes: Path) -> _Served:
    server = ServeProcess(["--model", name, "--registry", str(registry)], serve_env(home, recipes))
    try:
        server.wait_listening()
        server.wait_ready()
        answer = server.complete(prompt=[5, 17, 300, 42], max_tokens=4, temperature=0)
    finally:
        server.stop()
    return _Served(server.log, answer["choices"][0]["token_ids"])


def _steps(log: str) -> list[str]:
    return re.findall(r"prebake serve: ([a-z-]+): ", log)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
