"""Hugging Face checkpoints: the architecture config, the weights, and seeded random weights.

    <folder>/config.json                       architecture (LlamaConfig.from_hf / to_hf)
    <folder>/model.safetensors                 every tensor, by HF name (model.layers.0.self_attn.q_proj.weight, ...)
    <folder>/model.safetensors.index.json      or sharded: {"weight_map": {tensor name: shard file}}

State dicts here use the runtime's names: the HF names without the leading `model.` (`lm_head.weight`
as is, absent when the embeddings are tied). This module knows the checkpoint format only;
prebake.engine.bundled.runtime.model builds the runtime from what it returns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# Older Llama checkpoints store the rotary table; the runtime recomputes it from the config.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama-3.1 frequency scaling: long wavelengths slowed by `factor`, a smooth band between."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family architecture, normalised from a Hugging Face config.json.

    `attention_bias` puts a bias on q/k/v; Llama's attention_bias also biases o_proj
    (see `o_proj_bias`), Qwen2 always biases q/k/v and never o_proj.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        # Normalise numbers so a config built in python and one read from JSON digest alike.
        object.__setattr__(self, "rms_norm_eps", float(self.rms_norm_eps))
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        _check_config(self)

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias and self.model_type == "llama"

    @classmethod
    def from_hf(cls, hf: dict) -> LlamaConfig:
        """Read a Hugging Face config.json dict (transformers 4.x or 5.x layout)."""
        return _config_from_hf(cls, hf)

    def to_hf(self) -> dict:
        """A config.json dict that transformers 4.x and 5.x both load."""
        return _config_to_hf(self)


def _check_config(c: LlamaConfig) -> None:
    if c.model_type not in _ARCHITECTURES:
        raise ValueError(f"model_type {c.model_type!r} is not supported; use one of {sorted(_ARCHITECTURES)}")
    sizes = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    )
    for name in sizes:
        if getattr(c, name) <= 0:
            raise ValueError(f"config {name} must be positive, got {getattr(c, name)}")
    if c.num_attention_heads % c.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({c.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({c.num_key_value_heads}); fix the config"
        )
    if c.head_dim % 2:
        raise ValueError(f"head_dim ({c.head_dim}) must be even for rotary embeddings")
    if c.model_type == "qwen2" and not c.attention_bias:
        raise ValueError("qwen2 always has q/k/v bias: set attention_bias=True or use model_type 'llama'")
    if c.model_type == "mistral" and c.attention_bias:
        raise ValueError("mistral has no attention bias: use model_type 'llama' for a biased model")
    if c.mlp_bias and c.model_type != "llama":
        raise ValueError(f"mlp_bias exists only for model_type 'llama', not {c.model_type!r}")
    if c.sliding_window is not None and (c.model_type != "mistral" or c.sliding_window <= 0):
        raise ValueError(
            f"sliding_window={c.sliding_window} needs model_type 'mistral' and a positive "
            f"window; set it to None otherwise"
        )


def _config_from_hf(cls: type[LlamaConfig], hf: dict) -> LlamaConfig:
    model_type = hf.get("model_type")
    if model_type not in _ARCHITECTURES:
        raise ValueError(
            f"config.json model_type {model_type!r} is not supported; prebake runs {sorted(_ARCHITECTURES)}"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; only 'silu' is")
    missing = [
        k
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
        )
        if k not in hf
    ]
    if missing:
        raise ValueError(f"config.json lacks {missing}; it is not a complete {model_type} config")
    theta, scaling = _rope_from_hf(hf)
    heads = hf["num_attention_heads"]
    eos = hf.get("eos_token_id")
    return cls(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_position_embeddings=hf["max_position_embeddings"],
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        attention_bias=True if model_type == "qwen2" else hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        sliding_window=_sliding_window_from_hf(model_type, hf),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=() if eos is None else tuple(eos) if isinstance(eos, list) else (eos,),
    )


def _rope_from_hf(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    # transformers 5 writes rope_parameters (theta inside); 4.x writes rope_theta + rope_scaling.
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = hf.get("rope_theta", params.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor is not supported; prebake rotates the whole head")
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"rope type {rope_type!r} is not supported; prebake runs 'default' and 'llama3'")
    return theta, Llama3RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


def _sliding_window_from_hf(model_type: str, hf: dict) -> int | None:
    if model_type == "mistral":
        return hf.get("sliding_window")
    if model_type == "qwen2" and hf.get("use_sliding_window"):
        raise ValueError(
            "qwen2 with use_sliding_window=true (per-layer windows) is not supported; "
            "set use_sliding_window to false if the served context fits the window"
        )
    return None


def _config_to_hf(c: LlamaConfig) -> dict:
    hf = {
        "architectures": [_ARCHITECTURES[c.model_type]],
        "model_type": c.model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": c.tie_word_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": list(c.eos_token_ids) if len(c.eos_token_ids) > 1 else next(iter(c.eos_token_ids), None),
    }
    if c.rope_scaling is not None:
        hf["rope_scaling"] = {"rope_type": "llama3", **asdict(c.rope_scaling)}
    if c.model_type == "llama":
        hf.update(attention_bias=c.attention_bias, mlp_bias=c.mlp_bias)
    if c.model_type == "mistral":
        hf["sliding_window"] = c.sliding_window
    if c.model_type == "qwen2":
        hf["use_sliding_window"] = False
    return hf


def parameter_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the runtime holds for `config`, by runtime name."""
    c = config
    hidden, q_size, kv_size = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (c.vocab_size, hidden), "norm.weight": (hidden,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, hidden)
    linears = {  # name -> (out, in, has bias)
        "self_attn.q_proj": (q_size, hidden, c.attention_bias),
        "self_attn.k_proj": (kv_size, hidden, c.attention_bias),
        "self_attn.v_proj": (kv_size, hidden, c.attention_bias),
        "self_attn.o_proj": (hidden, q_size, c.o_proj_bias),
        "mlp.gate_proj": (c.intermediate_size, hidden, c.mlp_bias),
        "mlp.up_proj": (c.intermediate_size, hidden, c.mlp_bias),
        "mlp.down_proj": (hidden, c.intermediate_size, c.mlp_bias),
    }
    for i in range(c.num_hidden_layers):
        shapes[f"layers.{i}.input_layernorm.weight"] = (hidden,)
        shapes[f"layers.{i}.post_attention_layernorm.weight"] = (hidden,)
        for name, (out, inp, bias) in linears.items():
            shapes[f"layers.{i}.{name}.weight"] = (out, inp)
            if bias:
                shapes[f"layers.{i}.{name}.bias"] = (out,)
    return shapes


def check_state_dict(config: LlamaConfig, state_dict: Mapping[str, Tensor], source: str = "state dict") -> None:
    """Raise ValueError naming the missing, unexpected or mis-shaped tensors, if any."""
    expected = parameter_shapes(config)
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    wrong = sorted(
        f"{k} {tuple(state_dict[k].shape)} != {expected[k]}"
        for k in expected.keys() & state_dict.keys()
        if tuple(state_dict[k].shape) != expected[k]
    )
    problems = [
        f"{label} ({len(names)}): {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
        for label, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
        if names
    ]
    if problems:
        raise ValueError(
            f"{source} does not match the {config.model_type} config: {'; '.join(problems)}. "
            f"Check that config.json belongs to these weights"
        )


def load_hf_folder(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[LlamaConfig, dict[str, Tensor]]:
    """Read config.json and the safetensors weights (single file or sharded) of a model folder.

    safetensors maps each file: a tensor already in `dtype` is a view of the file's pages (read
    from the page cache as it is used, never copied); another dtype is converted, a copy."""
    folder = Path(path)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} not found: point at a Hugging Face model folder "
            f"holding {CONFIG_FILE} and {WEIGHTS_FILE} (or {INDEX_FILE} and its shards)"
        )
    config = LlamaConfig.from_hf(json.loads(config_path.read_text()))
    state_dict: dict[str, Tensor] = {}
    for file in weight_files(folder):
        with safe_open(file, framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not iterable)
                runtime_name = _runtime_name(config, name)
                if runtime_name is not None:
                    state_dict[runtime_name] = st.get_tensor(name).to(dtype)
    check_state_dict(config, state_dict, source=str(folder))
    return config, state_dict


def tiny_random_weights(config: LlamaConfig, seed: int = 0) -> dict[str, Tensor]:
    """Seeded fp32 weights, bitwise identical for the same seed on any machine.

    Built only from torch.rand on a CPU generator (a serial Mersenne Twister, no SIMD
    variants) and elementwise IEEE arithmetic. Scales keep activations near unit size
    so logits are well separated and greedy decoding is stable across implementations.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    weights = {}
    for name, shape in sorted(parameter_shapes(config).items()):
        uniform = torch.rand(shape, generator=generator, dtype=torch.float32) * 2 - 1
        if name.endswith("norm.weight"):
            weights[name] = uniform * 0.1 + 1
        elif name == "embed_tokens.weight":
            weights[name] = uniform * 3**0.5
        elif name.endswith(".bias"):
            weights[name] = uniform * 0.1
        else:
            weights[name] = uniform * (3 / shape[1]) ** 0.5
    return weights


def weight_files(folder: Path) -> list[Path]:
    single, index = folder / WEIGHTS_FILE, folder / INDEX_FILE
    if single.is_file():
        return [single]
    if not index.is_file():
        raise FileNotFoundError(
            f"no {WEIGHTS_FILE} or {INDEX_FILE} in {folder}; prebake reads safetensors "
            f"only (convert .bin weights with transformers' save_pretrained)"
        )
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    absent = [s for s in shards if not (folder / s).is_file()]
    if absent:
        raise FileNotFoundError(f"{index} names shards missing from {folder}: {absent}; download them again")
    return [folder / s for s in shards]


def _runtime_name(config: LlamaConfig, name: str) -> str | None:
    if name.endswith(_IGNORED_SUFFIXES):
        return None
    if name == "lm_head.weight":
        return None if config.tie_word_embeddings else name
    return name.removeprefix("model.") if name.startswith("model.") else name


def hf_name(runtime_name: str) -> str:
    """The Hugging Face name of a runtime tensor name (`model.` prefixed, lm_head as is)."""
    return runtime_name if runtime_name == "lm_head.weight" else "model." + runtime_name
