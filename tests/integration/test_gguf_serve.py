"""`prebake serve` of a recipe whose weights are a GGUF file: served from the folder it is dequantized
into once, and a file that is the user's problem ends the start in one line naming it, never as a bug."""

from __future__ import annotations

import json
from pathlib import Path

from prebake.artifacts.errors import ExitCode
from tests.support.gguf_files import TINY_CONFIG, hf_tensors, write_gguf
from tests.support.serving import ServeProcess, serve_env


def _recipe(folder: Path, gguf: Path, **config) -> Path:
    lines = ["[model]", 'name = "tiny-gguf"', f"weights = {json.dumps(str(gguf))}", "", "[model.config]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in {**TINY_CONFIG, **config}.items()]
    lines += ["", "[serving]", "max_model_len = 32", "max_num_seqs = 1", "max_num_batched_tokens = 32"]
    lines += ["block_size = 32", "", "[autotune]", "tactics = []", "warmup = 0", "iterations = 1", "layers = 1"]
    lines += ["", "[matrix]", 'platform = ["cpu"]', 'dtype = ["fp32"]']
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny-gguf.toml").write_text("\n".join(lines) + "\n")
    return folder


def test_an_eager_start_serves_a_gguf_with_its_tokenizer_and_chat_template(tmp_path):
    gguf = write_gguf(tmp_path / "tiny.gguf", TINY_CONFIG, hf_tensors(TINY_CONFIG))
    recipes = _recipe(tmp_path / "recipes", gguf)
    server = ServeProcess(["--model", "tiny-gguf", "--eager"], serve_env(tmp_path / "home", recipes))
    try:
        server.wait_ready(300)
        status, body = server.post("/tokenize", {"messages": [{"role": "user", "content": "abc"}]})
        assert status == 200 and body["tokens"][0] == 258  # <|im_start|>, whole: the GGUF's control token
        status, body = server.post("/v1/completions", {"prompt": "abcab", "max_tokens": 4, "temperature": 0})
        assert status == 200 and len(body["choices"][0]["token_ids"]) == 4
    finally:
        server.stop()
    assert "dequantizing tiny.gguf to float32 once" in server.log


def test_a_gguf_that_disagrees_with_the_recipe_ends_the_start_in_one_line_naming_the_field(tmp_path):
    gguf = write_gguf(tmp_path / "tiny.gguf", TINY_CONFIG, hf_tensors(TINY_CONFIG))
    recipes = _recipe(tmp_path / "recipes", gguf, num_hidden_layers=3)
    server = ServeProcess(["--model", "tiny-gguf", "--eager"], serve_env(tmp_path / "home", recipes))
    assert server.wait_exit(300) == ExitCode.INVALID
    assert (
        f"prebake: error: {gguf} does not match the recipe: its llama.block_count is 2, the recipe's config has "
        "num_hidden_layers = 3; write the config that belongs to this file in [model.config]"
    ) in server.log
    assert "bug in prebake" not in server.log and "Traceback" not in server.log
