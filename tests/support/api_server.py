"""A small eager `prebake serve` for the HTTP API tests: no torch.compile, ready in about a minute.

The first start builds buckets and autotune in place and writes them back, so every later
start from the same registry (the API-key server, the JSON-log server) only loads.
"""

from __future__ import annotations

from pathlib import Path

API_RECIPE = """
[model]
name = "{name}"
weights = "random"
seed = 0

[model.config]
architectures = ["LlamaForCausalLM"]
model_type = "llama"
vocab_size = 512
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 128

[serving]
max_model_len = 128
max_num_seqs = 4
max_num_batched_tokens = 128
block_size = 64

[autotune]
tactics = []
warmup = 0
iterations = 1

[matrix]
platform = ["cpu"]
dtype = ["fp32"]
"""


def write_api_recipe(folder: Path, name: str = "api-test") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(API_RECIPE.format(name=name))
    return folder
