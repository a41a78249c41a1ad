"""One rank of the Llama runtime at tp=WORLD, run as `python -m tests.support.tp_model RANK WORLD PORT DTYPE OUT`:
greedy tokens and the logits of every step shape below, saved to OUT by rank 0 (tests/unit/test_tensor_parallel.py)."""

from __future__ import annotations

import sys

import torch

from prebake.engine.bundled.runtime.lockstep import join, leave
from prebake.engine.bundled.runtime.model import KVCache, build_model, generate
from prebake.engine.bundled.runtime.weights import LlamaConfig, tiny_random_weights

CONFIG = {  # tiny-llama's architecture (recipes/tiny-llama.toml): 4 heads, 2 KV heads
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
PREFILLS = ((1, 8), (2, 16), (1, 32), (2, 64))  # (batch, tokens)
DECODES = ((1, 16), (2, 32), (2, 128))  # (batch, ctx_len)
PROMPTS = [[5, 17, 300, 42, 7], [1, 2, 3, 900, 11, 12, 13]]


def run(rank: int, world: int, port: int, dtype: torch.dtype) -> dict[str, torch.Tensor | list]:
    parallel = join(rank, world, port) if world > 1 else None
    config = LlamaConfig.from_hf(CONFIG)
    model = build_model(config, tiny_random_weights(config), dtype, parallel=parallel)
    cache = KVCache.allocate(model.config, 2, 128, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor | list] = {"tokens": generate(model, cache, PROMPTS, 24)}
    for b, t in PREFILLS:
        ids = torch.randint(0, config.vocab_size, (b, t), generator=generator)
        out[f"prefill-b{b}-t{t}"] = model.prefill(ids, torch.full((b,), t), torch.arange(b), cache)
    for b, ctx in DECODES:
        ids = torch.randint(0, config.vocab_size, (b,), generator=generator)
        positions = torch.full((b,), ctx - 1)
        out[f"decode-b{b}-c{ctx}"] = model.decode(ids, positions, torch.arange(b), cache, ctx)
    leave()
    return out


if __name__ == "__main__":
    rank, world, port, dtype_name, path = sys.argv[1:6]
    result = run(int(rank), int(world), int(port), getattr(torch, dtype_name))
    if int(rank) == 0:
        torch.save(result, path)
