"""A random checkpoint: seeded weights written once as a Hugging Face folder, loaded from it by mmap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime import checkpoint
from prebake.engine.bundled.runtime.checkpoint import checkpoint_folder, random_checkpoint, seeded_tensors
from prebake.engine.bundled.runtime.loader import recipe_config, reduced_model
from prebake.engine.bundled.runtime.weights import INDEX_FILE, LlamaConfig, load_hf_folder

# About 134 MB in bf16, most of it the embeddings: enough that a copy of the weights shows in RSS.
CONFIG = dict(
    model_type="llama",
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2048,
    num_hidden_layers=2,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
SPEC = ModelSpec(name="mid", weights="random-checkpoint", seed=3, config=CONFIG)


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_a_random_checkpoint_is_written_once_as_a_hugging_face_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "SHARD_BYTES", 40 << 20)  # several shards, as a downloaded 8B has
    first = random_checkpoint(SPEC, tmp_path, log=lambda _: None)
    assert first.written and first.folder == checkpoint_folder(SPEC, tmp_path)
    index = json.loads((first.folder / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((first.folder / s).is_file() for s in shards)
    assert "model.embed_tokens.weight" in index["weight_map"] and "lm_head.weight" not in index["weight_map"]
    assert json.loads((first.folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    before = _files(first.folder)
    again = random_checkpoint(SPEC, tmp_path, log=lambda _: pytest.fail("a second load wrote"))
    assert not again.written and again.folder == first.folder
    assert _files(first.folder) == before  # nothing rewritten
    assert sorted(p.name for p in first.folder.parent.iterdir()) == sorted(
        [first.folder.name, first.folder.name + ".lock"]
    )
    config, state = load_hf_folder(first.folder, torch.bfloat16)
    assert config == LlamaConfig.from_hf(CONFIG) and state["embed_tokens.weight"].dtype == torch.bfloat16


def test_the_same_seed_writes_the_same_bits_and_another_seed_another_folder(tmp_path):
    config = LlamaConfig.from_hf(CONFIG)
    one = dict(seeded_tensors(config, 3, torch.bfloat16))
    two = dict(seeded_tensors(config, 3, torch.bfloat16))
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert not torch.equal(one["layers.0.mlp.up_proj.weight"], one["layers.1.mlp.up_proj.weight"])
    other = SPEC.model_copy(update={"seed": 4})
    assert checkpoint_folder(other, tmp_path) != checkpoint_folder(SPEC, tmp_path)


def test_a_reduced_model_keeps_the_widths_and_cuts_the_layers():
    untied = SPEC.model_copy(update={"config": {**CONFIG, "tie_word_embeddings": False}})
    assert not recipe_config(untied).tie_word_embeddings  # as llama3-8b's
    model = reduced_model(untied, "bf16", layers=1)
    assert len(model.layers) == 1 and model.embed_tokens.weight.shape == (32000, 1024)
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    # one vocab-sized matrix, the embeddings', serves as the head: the logits' matmul keeps its shape
    assert model.lm_head is None
    vocab_sized = [p for p in model.parameters() if p.shape[0] == 32000]
    assert len(vocab_sized) == 1
    hidden = torch.zeros(2, 1024, dtype=torch.bfloat16)
    assert model._logits(hidden).shape == (2, 32000)


_LOAD_AND_TOUCH = """
import json, sys
from pathlib import Path
import torch
from prebake.engine.bundled.runtime.weights import load_hf_folder

def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile")}

before = rss()
config, state = load_hf_folder(Path(sys.argv[1]), torch.bfloat16)
for t in state.values():  # every page read (one value in 1024: 2 KB apart), no large temporaries
    t.view(-1)[::1024].float().sum()
after = rss()
print(json.dumps({"anon": after["RssAnon"] - before["RssAnon"], "file": after["RssFile"] - before["RssFile"],
                  "bytes": sum(t.numel() * t.element_size() for t in state.values())}))
"""


def test_a_checkpoint_loads_by_mmap_without_a_copy(tmp_path):
    folder = random_checkpoint(SPEC, tmp_path, log=lambda _: None).folder
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_TOUCH, str(folder)], capture_output=True, text=True, check=True
    )
    grown = json.loads(done.stdout.strip().splitlines()[-1])
    # every weight was read: its pages are the file's (page cache), not a private copy of them
    assert grown["file"] > 0.9 * grown["bytes"], grown
    assert grown["anon"] < 0.1 * grown["bytes"], grown
