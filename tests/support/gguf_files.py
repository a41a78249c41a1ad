"""Small llama-architecture GGUF files written with gguf-py's own writer, as llama.cpp's converter
lays them out (q and k rows in ggml's rotary order, names blk.N.*), and the HF tensors they hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# A 2-layer Llama with grouped-query attention (4 query heads over 2 KV heads), a byte-level vocabulary
# of the 256 byte symbols, two merges and two control tokens.
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 260,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's reorder of q/k rows: per head, (half, pair) -> (pair, half)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def hf_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 tensors by HF name (model.layers.0.self_attn.q_proj.weight, ...), [out, in]."""
    rng = np.random.default_rng(seed)
    c = config
    hidden, head_dim = c["hidden_size"], c["head_dim"]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (c["num_attention_heads"] * head_dim, hidden),
            p + "self_attn.k_proj.weight": (c["num_key_value_heads"] * head_dim, hidden),
            p + "self_attn.v_proj.weight": (c["num_key_value_heads"] * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, c["num_attention_heads"] * head_dim),
            p + "mlp.gate_proj.weight": (c["intermediate_size"], hidden),
            p + "mlp.up_proj.weight": (c["intermediate_size"], hidden),
            p + "mlp.down_proj.weight": (hidden, c["intermediate_size"]),
        }
    return {name: rng.uniform(-0.5, 0.5, shape).astype(np.float32) for name, shape in shapes.items()}


_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    module = rest.removesuffix(".weight")
    return f"blk.{layer}.{_GGUF_NAMES[module]}.weight"


def write_gguf(path: Path, config: dict, tensors: dict[str, np.ndarray], *, raw_type: str | None = None) -> Path:
    """A GGUF of `tensors` (F32), its metadata from `config`; `raw_type`: one attn_v tensor written as
    blocks of that quantization type instead (its bytes arbitrary)."""
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    c = config
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(c["num_key_value_heads"])
    writer.add_rope_dimension_count(c["head_dim"])
    writer.add_rope_freq_base(c["rope_theta"])
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_vocab_size(c["vocab_size"])
    _add_tokenizer(writer)
    for name, values in tensors.items():
        if name.endswith("q_proj.weight"):
            values = llama_cpp_permute(values, c["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            values = llama_cpp_permute(values, c["num_key_value_heads"])
        if raw_type is not None and name == "model.layers.0.self_attn.v_proj.weight":
            qtype = gguf.GGMLQuantizationType[raw_type]
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((values.shape[0], values.shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(gguf_name(name), raw, raw_dtype=qtype)  # the shape: from the bytes, by the type
            continue
        writer.add_tensor(gguf_name(name), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer) -> None:
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = [*alphabet, "ab", "abc", "<|im_start|>", "<|im_end|>"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 2) + [3, 3])
    writer.add_token_merges(["a b", "ab c"])
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
