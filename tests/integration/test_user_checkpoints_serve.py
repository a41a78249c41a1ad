"""`prebake serve` of a recipe whose weights are a user's Hugging Face folder, half-downloaded or paired
with the wrong config (issue 46 item 5): the real command in a subprocess exits 2 with one line that
names the file or field, what was expected and found, and the fix; never a traceback, never "a bug in
prebake". The first to read the folder is the autotune build child of an empty store: its refusal
reaches the command as the user's error, not as a failed build."""

from __future__ import annotations

import json
import tomllib

import pytest

from prebake.engine.bundled.runtime.weights import CONFIG_FILE, WEIGHTS_FILE, LlamaConfig, tiny_random_weights
from tests.support.hf_folder import save_hf_folder
from tests.support.serving import SERVE_TEST_RECIPE, ServeProcess, serve_env


def _cut_short(folder, hf):
    weights = folder / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:20_000])
    return [str(weights), "not a whole safetensors file", "20,000 are on disk", "download it again"]


def _config_of_other_weights(folder, hf):
    """config.json and the recipe both say 3 layers; the weights hold 2."""
    config = LlamaConfig.from_hf({**hf, "num_hidden_layers": 3})
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_hf()))
    return ["num_hidden_layers = 3; the weights hold 2 layers", "belongs to these weights"]


def _config_of_another_model(folder, hf):
    """config.json says 4 KV heads, the recipe 2."""
    (folder / CONFIG_FILE).write_text(
        json.dumps({**json.loads((folder / CONFIG_FILE).read_text()), "num_key_value_heads": 4})
    )
    return [str(folder / CONFIG_FILE), "num_key_value_heads: the recipe says 2, config.json says 4", "bake again"]


@pytest.mark.parametrize("damage", [_cut_short, _config_of_other_weights, _config_of_another_model])
def test_serving_a_damaged_folder_exits_2_naming_the_file_and_the_fix(tmp_path, damage):
    text = SERVE_TEST_RECIPE.format(name="mine", variant="aoti-package", seqs=1, seed=0)
    hf = tomllib.loads(text)["model"]["config"]
    folder = save_hf_folder(LlamaConfig.from_hf(hf), tiny_random_weights(LlamaConfig.from_hf(hf)), tmp_path / "model")
    expected = damage(folder, hf)
    if damage is _config_of_other_weights:
        text = text.replace("num_hidden_layers = 2", "num_hidden_layers = 3")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.toml").write_text(text.replace('weights = "random"', f'weights = "{folder}"'))
    server = ServeProcess(["--model", "mine", "--eager"], serve_env(tmp_path / "home", tmp_path / "recipes"))
    code = server.wait_exit(timeout=300)
    last = server.lines[-1]
    assert code == 2, server.log[-3000:]
    assert last.startswith("prebake: error: "), server.log[-3000:]
    for text in expected:
        assert text in last, f"{text!r} not in {last}"
    assert "bug in prebake" not in server.log and "Traceback" not in server.log and "unexpected" not in server.log
