"""Reading a llama-architecture GGUF file: checked whole, its architecture against the recipe's, its
tensors dequantized to float32 under the runtime's names.

A GGUF (llama.cpp's format) holds metadata (`llama.block_count`, `tokenizer.ggml.tokens`, ...) and
tensors in blocks of a quantization type. The `gguf` library (llama.cpp's own gguf-py) maps the
file and dequantizes each type in numpy. Two things differ from a Hugging Face checkpoint:

- names: `blk.3.attn_q.weight` is `layers.3.self_attn.q_proj.weight`, `token_embd` the embeddings;
- q and k rows: llama.cpp's converter reorders each head's rows from the two-halves rotary layout
  transformers uses to the interleaved pairs ggml's RoPE uses; `_unpermute` restores the halves
  (q over the attention heads, k over the KV heads).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prebake.engine.bundled.runtime.gguf_fetch import GgufError
from prebake.engine.bundled.runtime.weights import LlamaConfig

# What prebake dequantizes: the float types, llama.cpp's legacy block types and its k-quants. The
# i-quants (IQ*), ternary (TQ*), MXFP4/NVFP4 and Q1_0 are refused by name: untested here, and the
# numpy dequantization of the i-quants' lattices takes minutes for a small model.
LOADED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_IGNORED = ("rope_freqs.weight",)  # llama3 frequency factors: the runtime computes them from the config


@dataclass(frozen=True)
class GgufFile:
    """An opened GGUF whose every tensor lies wholly inside the file."""

    path: Path
    reader: Any  # gguf.GGUFReader

    def field(self, key: str, default: Any = None) -> Any:
        found = self.reader.fields.get(key)
        return default if found is None else found.contents()

    @property
    def architecture(self) -> str:
        return str(self.field("general.architecture", ""))


def open_gguf(path: Path) -> GgufFile:
    """Map `path` and check that it is a whole GGUF file; GgufError names the file and the fix otherwise."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError, OverflowError) as exc:
        raise GgufError(
            f"{path} is not a readable GGUF file ({exc}): it is truncated or not GGUF; download it again"
        ) from exc
    size = path.stat().st_size
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise GgufError(
                f"{path} is truncated: tensor {tensor.name} ends at byte {end}, the file has {size}; download it again"
            )
    return GgufFile(path, reader)


def check_architecture(gguf: GgufFile, config: LlamaConfig) -> None:
    """Refuse a GGUF whose architecture metadata differs from the recipe's config, naming the field."""
    if gguf.architecture != "llama":
        raise GgufError(
            f"{gguf.path} holds a {gguf.architecture!r} model; prebake reads llama-architecture GGUF files only"
        )
    c, a = config, "llama."
    wanted = {  # GGUF key -> (recipe config field, its value, the GGUF's default when the key is absent)
        a + "block_count": ("num_hidden_layers", c.num_hidden_layers, None),
        a + "embedding_length": ("hidden_size", c.hidden_size, None),
        a + "feed_forward_length": ("intermediate_size", c.intermediate_size, None),
        a + "attention.head_count": ("num_attention_heads", c.num_attention_heads, None),
        a + "attention.head_count_kv": (
            "num_key_value_heads",
            c.num_key_value_heads,
            gguf.field(a + "attention.head_count"),
        ),
        a + "rope.dimension_count": ("head_dim", c.head_dim, c.hidden_size // c.num_attention_heads),
        a + "rope.freq_base": ("rope_theta", c.rope_theta, 10000.0),
        a + "attention.layer_norm_rms_epsilon": ("rms_norm_eps", c.rms_norm_eps, None),
        a + "vocab_size": ("vocab_size", c.vocab_size, len(gguf.field("tokenizer.ggml.tokens", []))),
    }
    for key, (name, value, default) in wanted.items():
        found = gguf.field(key, default)
        if found is None or not _same(found, value):
            raise GgufError(
                f"{gguf.path} does not match the recipe: its {key} is {found}, the recipe's config has "
                f"{name} = {value}; write the config that belongs to this file in [model.config]"
            )
    tied = not any(t.name == "output.weight" for t in gguf.reader.tensors)
    if tied != c.tie_word_embeddings:
        raise GgufError(
            f"{gguf.path} {'has no' if tied else 'has an'} output.weight, the recipe's config has "
            f"tie_word_embeddings = {str(c.tie_word_embeddings).lower()}; set it to {str(tied).lower()}"
        )


def _same(found: Any, value: Any) -> bool:
    if isinstance(value, float):  # GGUF stores float32: 1e-5 is 9.99999974e-06 there
        return bool(np.float32(found) == np.float32(value))
    return bool(found == value)


def check_types(gguf: GgufFile) -> None:
    """Refuse a file holding a tensor of a quantization type prebake does not dequantize, naming it."""
    refused = sorted({t.tensor_type.name for t in gguf.reader.tensors} - set(LOADED_TYPES))
    if refused:
        example = next(t.name for t in gguf.reader.tensors if t.tensor_type.name in refused)
        raise GgufError(
            f"{gguf.path} holds tensors of quantization type {', '.join(refused)} (e.g. {example}), which "
            f"prebake does not dequantize; it loads {', '.join(LOADED_TYPES)}: pick one of those files "
            f"(e.g. a Q4_K_M or Q8_0 build of the model)"
        )


def dequantized(gguf: GgufFile, config: LlamaConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor by runtime name, dequantized to float32 in Hugging Face's [out, in] layout."""
    from gguf.quants import dequantize

    for tensor in gguf.reader.tensors:
        if tensor.name in _IGNORED:
            continue
        name = runtime_name(tensor.name, gguf.path)
        values = np.array(
            dequantize(tensor.data, tensor.tensor_type), dtype=np.float32
        )  # writable: torch takes it as is
        if name.endswith("self_attn.q_proj.weight"):
            values = _unpermute(values, config.num_attention_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            values = _unpermute(values, config.num_key_value_heads)
        yield name, values


def runtime_name(gguf_name: str, path: Path) -> str:
    """`blk.3.attn_q.weight` -> `layers.3.self_attn.q_proj.weight`; GgufError for a tensor llama has not."""
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise GgufError(f"{path} holds tensor {gguf_name!r}, which a llama model has not; is it a llama GGUF?")


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row order: per head, rows (pair i, half h) back to (half h, pair i)."""
    pairs = rows.shape[0] // heads // 2
    return rows.reshape(heads, pairs, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
