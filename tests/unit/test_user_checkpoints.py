"""A user's checkpoint, half-downloaded or mismatched: every fault is the user's file, named with the fix.

Real files cut short or corrupted on disk and read by the real loader (safetensors, json); each
refusal is a CheckpointError (or the recipe's RecipeError) whose message names the file or field,
what was expected against what was found, and what to do; none reads as "a bug in prebake" through
the CLI's one table of failures (engine/cli/outcome.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from prebake.artifacts.errors import CheckpointError, ExitCode, RecipeError
from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.checkpoint import random_checkpoint
from prebake.engine.bundled.runtime.loader import load_model
from prebake.engine.bundled.runtime.weights import (
    CONFIG_FILE,
    INDEX_FILE,
    WEIGHTS_FILE,
    LlamaConfig,
    hf_name,
    load_hf_folder,
    tiny_random_weights,
)
from prebake.engine.cli.outcome import failure
from tests.support.hf_folder import save_hf_folder

HF = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
CONFIG = LlamaConfig.from_hf(HF)


def _folder(tmp_path: Path, config: LlamaConfig = CONFIG) -> Path:
    return save_hf_folder(config, tiny_random_weights(config), tmp_path / "model")


def _sharded(tmp_path: Path) -> Path:
    """The weights in two shards and an index, as a downloaded model has them."""
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / CONFIG_FILE).write_text(json.dumps(CONFIG.to_hf()))
    tensors = {hf_name(k): v for k, v in tiny_random_weights(CONFIG).items()}
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, held in shards.items():
        save_file({n: tensors[n] for n in held}, folder / shard)
    weight_map = {n: shard for shard, held in shards.items() for n in held}
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _refused(folder: Path, *expected: str) -> str:
    """The load's refusal: a CheckpointError saying each of `expected`, never a bug in prebake."""
    with pytest.raises(CheckpointError) as raised:
        load_hf_folder(folder)
    return _said(raised.value, *expected)


def _said(exc: BaseException, *expected: str) -> str:
    told = failure(exc)
    assert told.code == ExitCode.INVALID
    assert "bug in prebake" not in told.message and "unexpected" not in told.message
    for text in expected:
        assert text in told.message, f"{text!r} not in: {told.message}"
    return told.message


def test_a_whole_folder_loads_single_and_sharded(tmp_path):
    config, state = load_hf_folder(_folder(tmp_path))
    assert config == CONFIG and torch.equal(state["norm.weight"], tiny_random_weights(CONFIG)["norm.weight"])
    assert load_hf_folder(_sharded(tmp_path))[1].keys() == state.keys()


@pytest.mark.parametrize("keep", [0, 4, 100, 0.5, -1])
def test_a_safetensors_file_cut_short_says_how_short_and_to_download_it_again(tmp_path, keep):
    folder = _folder(tmp_path)
    weights = folder / WEIGHTS_FILE
    whole = weights.read_bytes()
    weights.write_bytes(whole[: int(len(whole) * keep) if isinstance(keep, float) else keep % len(whole)])
    message = _refused(folder, str(weights), "not a whole safetensors file", "download it again")
    if isinstance(keep, float) or keep < 0:  # the header is whole: what it promises against what is there
        assert f"its header describes {len(whole):,} bytes" in message


def test_garbage_where_the_weights_should_be_is_named(tmp_path):
    folder = _folder(tmp_path)
    (folder / WEIGHTS_FILE).write_bytes(b"<html>Rate limit exceeded</html>" * 4)
    _refused(folder, str(folder / WEIGHTS_FILE), "download it again")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{not json", "is not valid JSON"),
        ('["llama"]', "holds a JSON list, expected a JSON object"),
        (json.dumps({k: v for k, v in HF.items() if k != "hidden_size"}), "lacks ['hidden_size']"),
        (json.dumps({**HF, "num_hidden_layers": "2"}), "num_hidden_layers = '2': expected whole numbers"),
        (json.dumps({**HF, "model_type": "gpt2"}), "model_type 'gpt2' is not supported"),
        (json.dumps({**HF, "rope_scaling": {"rope_type": "llama3"}}), "lacks the field 'factor'"),
    ],
)
def test_a_config_json_that_is_not_a_config_is_named_with_the_field(tmp_path, text, expected):
    folder = _folder(tmp_path)
    (folder / CONFIG_FILE).write_text(text)
    _refused(folder, str(folder / CONFIG_FILE), expected)


def test_config_json_with_more_layers_than_the_weights_says_both_counts(tmp_path):
    folder = _folder(tmp_path)
    (folder / CONFIG_FILE).write_text(json.dumps({**HF, "num_hidden_layers": 3}))
    _refused(folder, "num_hidden_layers = 3; the weights hold 2 layers", "missing (9)", "belongs to these weights")


def test_config_json_with_fewer_layers_than_the_weights_says_both_counts(tmp_path):
    folder = _folder(tmp_path)
    (folder / CONFIG_FILE).write_text(json.dumps({**HF, "num_hidden_layers": 1}))
    _refused(folder, "num_hidden_layers = 1; the weights hold 2 layers", "extra (9)")


def test_a_tensor_of_the_wrong_shape_missing_or_extra_is_named(tmp_path):
    folder = _folder(tmp_path)
    tensors = {hf_name(k): v for k, v in tiny_random_weights(CONFIG).items()}
    tensors["model.norm.weight"] = torch.ones(16)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.extra.weight"] = torch.ones(2)
    save_file(tensors, folder / WEIGHTS_FILE)
    _refused(
        folder,
        "wrong shape (1): norm.weight (16,) != (32,)",
        "missing (1): layers.1.mlp.up_proj.weight",
        "extra (1): layers.0.self_attn.extra.weight",
    )


def test_a_quantized_tensor_is_refused_naming_its_dtype(tmp_path):
    folder = _folder(tmp_path)
    tensors = {hf_name(k): v for k, v in tiny_random_weights(CONFIG).items()}
    tensors["model.norm.weight"] = torch.ones(32, dtype=torch.int8)
    save_file(tensors, folder / WEIGHTS_FILE)
    _refused(folder, "tensor model.norm.weight is I8, expected a floating-point dtype", "unquantized")


def test_an_index_naming_a_shard_not_there_asks_for_the_shards(tmp_path):
    folder = _sharded(tmp_path)
    (folder / "model-00002-of-00002.safetensors").unlink()
    _refused(folder, str(folder / INDEX_FILE), "missing from", "model-00002-of-00002.safetensors", "download them")


def test_a_shard_from_another_download_lacks_what_the_index_maps_to_it(tmp_path):
    folder = _sharded(tmp_path)
    shard = folder / "model-00001-of-00002.safetensors"
    save_file({"model.norm.weight": torch.ones(32)}, shard)
    _refused(folder, str(shard), "tensors its index", "download both again")


@pytest.mark.parametrize(
    "index, expected",
    [
        ("{", "is not valid JSON"),
        (json.dumps({"metadata": {}}), 'no "weight_map"'),
        (json.dumps({"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}}), "outside the folder"),
    ],
)
def test_an_index_that_is_not_an_index_is_named(tmp_path, index, expected):
    folder = _sharded(tmp_path)
    (folder / INDEX_FILE).write_text(index)
    _refused(folder, str(folder / INDEX_FILE), expected)


def test_a_shard_cut_short_is_named(tmp_path):
    folder = _sharded(tmp_path)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    _refused(folder, str(shard), "download it again")


def test_the_recipes_config_and_the_folders_must_agree_before_a_weight_is_read(tmp_path):
    folder = _folder(tmp_path, LlamaConfig.from_hf({**HF, "num_hidden_layers": 3}))
    (folder / WEIGHTS_FILE).write_bytes(b"never read")  # the refusal comes first
    spec = ModelSpec(name="mine", weights=str(folder), config=HF)
    with pytest.raises(CheckpointError) as raised:
        load_model(spec, "fp32")
    _said(raised.value, str(folder / CONFIG_FILE), "num_hidden_layers: the recipe says 2, config.json says 3")
    _said(raised.value, "compiled and keyed for", "bake again")


def test_a_folder_that_agrees_with_its_recipe_loads_whatever_its_eos_tokens(tmp_path):
    folder = _folder(tmp_path, LlamaConfig.from_hf({**HF, "eos_token_id": [7, 8]}))
    model = load_model(ModelSpec(name="mine", weights=str(folder), config=HF), "fp32")
    assert model.config.num_hidden_layers == 2


def test_a_recipe_config_the_runtime_cannot_run_is_the_recipes_error(tmp_path):
    spec = ModelSpec(name="mine", weights="random", config={**HF, "model_type": "gpt2"})
    with pytest.raises(RecipeError) as raised:
        load_model(spec, "fp32")
    _said(raised.value, "recipe 'mine' [model.config]", "model_type 'gpt2'")


def test_a_random_checkpoint_cut_short_says_prebake_writes_it_again(tmp_path):
    spec = ModelSpec(name="mine", weights="random-checkpoint", config=HF)
    folder = random_checkpoint(spec, tmp_path, log=lambda _: None).folder
    shard = next(folder.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError) as raised:
        load_model(spec, "fp32", home=tmp_path)
    _said(raised.value, str(shard), "delete the folder and the next start writes it again")
