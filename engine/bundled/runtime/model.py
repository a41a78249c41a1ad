"""The model runtime: a Llama-family decoder on plain torch with a static KV cache.

Covers Llama 2/3 (with Llama-3 rope scaling), Mistral (with sliding-window attention)
and Qwen2 (q/k/v bias), with grouped-query attention. Built for bucketed serving:

    prefill(input_ids[B, T], lengths[B], slots[B], cache)        -> logits[B, vocab]
    decode(input_ids[B], positions[B], slots[B], cache, ctx_len) -> logits[B, vocab]

Every shape inside either call follows from the input shapes and the static python
values (ctx_len, attn_impl), so one bucket is one static graph that torch.compile
(dynamic=False, fullgraph=True) captures whole. The cache is written in place.
Choosing buckets and padding requests to them is the engine's job, not this module's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from prebake.engine.bundled.runtime.parallel import Parallel, all_reduce, local_config, shard_state_dict
from prebake.engine.bundled.runtime.weights import Llama3RopeScaling, LlamaConfig, check_state_dict

__all__ = [
    "ATTN_IMPLS",
    "KVCache",
    "Llama",
    "Llama3RopeScaling",
    "LlamaConfig",
    "attend",
    "build_model",
    "generate",
    "rope_inv_freq",
    "sample",
]

ATTN_IMPLS = ("sdpa", "matmul")


@dataclass(frozen=True)
class KVCache:
    """Static per-layer key and value storage, one row (slot) per sequence being served.

    keys[layer] and values[layer] are [num_slots, num_key_value_heads, max_model_len, head_dim],
    zero-filled so masked-out positions never hold NaN.
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @classmethod
    def allocate(
        cls,
        config: LlamaConfig,
        num_slots: int,
        max_model_len: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        if num_slots <= 0 or max_model_len <= 0:
            raise ValueError(
                f"a KV cache needs num_slots > 0 and max_model_len > 0, got {num_slots} and {max_model_len}"
            )
        shape = (num_slots, config.num_key_value_heads, max_model_len, config.head_dim)

        def zeros() -> tuple[Tensor, ...]:
            return tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers))

        return cls(keys=zeros(), values=zeros())

    @property
    def num_slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_model_len(self) -> int:
        return self.keys[0].shape[2]


def rope_inv_freq(config: LlamaConfig) -> Tensor:
    """Rotary inverse frequencies (fp32), Llama-3 scaled when the config asks for it."""
    dim = config.head_dim
    # on the CPU even under a meta-device context (build_model's), where these ops would go through
    # torch's Python references and import Dynamo
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, impl: str) -> Tensor:
    """Grouped-query attention: q [B, H, Tq, D], k/v [B, KV, Tk, D], mask [B or 1, 1, Tq, Tk] (True = see)."""
    b, heads, tq, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if impl == "sdpa":
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # Fold the query heads of one KV group together so K/V are broadcast, never copied.
    q = q.reshape(b, kv_heads, group, tq, d)
    scores = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)) * (d**-0.5)
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v.unsqueeze(2)).reshape(b, heads, tq, d)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig, dtype: torch.dtype, parallel: Parallel | None = None) -> None:
        super().__init__()
        self.parallel = parallel
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_size, kv_size = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, q_size, bias=c.attention_bias, dtype=dtype)
        self.k_proj = nn.Linear(c.hidden_size, kv_size, bias=c.attention_bias, dtype=dtype)
        self.v_proj = nn.Linear(c.hidden_size, kv_size, bias=c.attention_bias, dtype=dtype)
        self.o_proj = nn.Linear(q_size, c.hidden_size, bias=c.o_proj_bias, dtype=dtype)
        self.qkv_proj: nn.Module | None = None  # q, k and v as one linear (an FP8 model's: runtime/fp8_load)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        mask: Tensor,
        exchange: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
        impl: str,
    ) -> Tensor:
        """`exchange` writes this step's K/V into the cache and returns the K/V to attend over."""
        b, t, _ = x.shape
        q, k, v = self._project(x)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _apply_rope(q, *rope), _apply_rope(k, *rope)
        k, v = exchange(k, v)
        out = attend(q, k, v, mask, impl)
        return all_reduce(self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)), self.parallel)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split((q_size, kv_size, kv_size), dim=-1)
        return q, k, v


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig, dtype: torch.dtype, parallel: Parallel | None = None) -> None:
        super().__init__()
        self.parallel = parallel
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias, dtype=dtype)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias, dtype=dtype)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias, dtype=dtype)
        self.gate_up_proj: nn.Module | None = None  # gate and up as one linear (an FP8 model's: runtime/fp8_load)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up_proj is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return all_reduce(self.down_proj(F.silu(gate) * up), self.parallel)


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig, dtype: torch.dtype, parallel: Parallel | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.self_attn = Attention(c, dtype, parallel)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.mlp = MLP(c, dtype, parallel)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        mask: Tensor,
        exchange: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
        impl: str,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, mask, exchange, impl)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """The decoder. Parameter names are the Hugging Face ones without the leading `model.`.

    With `parallel`, one rank of a tensor-parallel group (runtime/parallel.py): `config` is the
    rank's share of the architecture (parallel.local_config), and attention and the MLP end in an
    all-reduce."""

    inv_freq: Tensor  # a registered buffer (nn.Module types buffers as Tensor | Module)

    def __init__(
        self, config: LlamaConfig, dtype: torch.dtype = torch.float32, parallel: Parallel | None = None
    ) -> None:
        super().__init__()
        self.config, self.parallel = config, parallel
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(config, dtype, parallel) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)
        )
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    @torch.no_grad()
    def prefill(
        self, input_ids: Tensor, lengths: Tensor, slots: Tensor, cache: KVCache, attn_impl: str = "sdpa"
    ) -> Tensor:
        """Run right-padded prompts; fill cache rows `slots` at positions 0..T-1.

        Returns fp32 logits [B, vocab] of each row's last real token (index lengths-1).
        Padding never changes a real token's result; rows must name distinct slots.
        """
        b, t = self._check_step(input_ids, lengths, slots, cache, attn_impl)
        if t > cache.max_model_len:
            raise ValueError(f"prefill length {t} exceeds the cache's max_model_len {cache.max_model_len}")
        rope = _rope_cos_sin(torch.arange(t, device=input_ids.device), self.inv_freq, self.embed_tokens.weight.dtype)
        mask = _causal_mask(t, self.config.sliding_window, input_ids.device)
        x = self.embed_tokens(input_ids)
        for layer, k_cache, v_cache in zip(self.layers, cache.keys, cache.values):

            def exchange(k: Tensor, v: Tensor, k_cache: Tensor = k_cache, v_cache: Tensor = v_cache):
                k_cache[slots, :, :t] = k
                v_cache[slots, :, :t] = v
                return k, v

            x = layer(x, rope, mask, exchange, attn_impl)
        return self._logits(x[torch.arange(b, device=x.device), lengths - 1])

    @torch.no_grad()
    def decode(
        self, input_ids: Tensor, positions: Tensor, slots: Tensor, cache: KVCache, ctx_len: int, attn_impl: str = "sdpa"
    ) -> Tensor:
        """Run one new token per row at `positions`, attending over cache[slots, :, :ctx_len].

        ctx_len is static (the decode bucket's context); every position must be < ctx_len.
        Returns fp32 logits [B, vocab].
        """
        ids = input_ids[:, 0] if input_ids.dim() == 2 and input_ids.shape[1] == 1 else input_ids
        if ids.dim() != 1:
            raise ValueError(f"decode takes one token per row, input_ids [B] or [B, 1]; got {tuple(input_ids.shape)}")
        self._check_step(ids[:, None], positions, slots, cache, attn_impl)
        if not 0 < ctx_len <= cache.max_model_len:
            raise ValueError(f"ctx_len {ctx_len} must be in 1..{cache.max_model_len} (the cache's max_model_len)")
        rope = tuple(
            r[:, None, None, :] for r in _rope_cos_sin(positions, self.inv_freq, self.embed_tokens.weight.dtype)
        )
        mask = _decode_mask(positions, ctx_len, self.config.sliding_window)
        x = self.embed_tokens(ids)[:, None, :]
        for layer, k_cache, v_cache in zip(self.layers, cache.keys, cache.values):

            def exchange(k: Tensor, v: Tensor, k_cache: Tensor = k_cache, v_cache: Tensor = v_cache):
                k_cache[slots, :, positions] = k[:, :, 0]
                v_cache[slots, :, positions] = v[:, :, 0]
                return k_cache[slots, :, :ctx_len], v_cache[slots, :, :ctx_len]

            x = layer(x, rope, mask, exchange, attn_impl)
        return self._logits(x[:, 0])

    def _check_step(
        self, ids: Tensor, per_row: Tensor, slots: Tensor, cache: KVCache, attn_impl: str
    ) -> tuple[int, int]:
        # Shapes and python values only: dynamo evaluates these once per graph, at trace time.
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl {attn_impl!r} is unknown; use one of {ATTN_IMPLS}")
        if ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens], got shape {tuple(ids.shape)}")
        b = ids.shape[0]
        if tuple(per_row.shape) != (b,) or tuple(slots.shape) != (b,):
            raise ValueError(
                f"lengths/positions {tuple(per_row.shape)} and slots {tuple(slots.shape)} "
                f"must both be [{b}], one entry per row of input_ids"
            )
        dtype = self.embed_tokens.weight.dtype
        if len(cache.keys) != len(self.layers) or cache.keys[0].dtype != dtype:
            raise ValueError(
                f"the KV cache ({len(cache.keys)} layers, {cache.keys[0].dtype}) does not fit this "
                f"model ({len(self.layers)} layers, {dtype}); allocate it from the model's config and dtype"
            )
        return b, ids.shape[1]

    def _logits(self, h: Tensor) -> Tensor:
        h = self.norm(h)
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight).float()


def build_model(
    config: LlamaConfig,
    state_dict: Mapping[str, Tensor],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    parallel: Parallel | None = None,
) -> Llama:
    """The runtime in eval mode with `state_dict` (runtime names) cast to dtype, no gradients;
    with `parallel`, the rank's shard of it (runtime/parallel.py).

    Tensors already of that dtype and device are used as they are, not copied.
    """
    check_state_dict(config, state_dict)
    with torch.device("meta"), SkipInit():  # no throwaway random init of a multi-gigabyte model
        model = Llama(local_config(config, parallel), dtype, parallel)
    shard = shard_state_dict(config, state_dict, parallel)
    model.load_state_dict(
        {k: v.to(device=device, dtype=dtype).contiguous() for k, v in shard.items()}, strict=True, assign=True
    )
    model.inv_freq = rope_inv_freq(config).to(device)
    return model.eval().requires_grad_(False)


class SkipInit(TorchFunctionMode):
    """torch.nn.init's functions left undone: every parameter is replaced by the state dict's.

    On the meta device they would run through torch's Python references, which import Dynamo
    (seconds of a start that otherwise needs none of it: the aoti-package variant's)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def _causal_mask(t: int, window: int | None, device: torch.device) -> Tensor:
    # Right padding sits after every real token, so causality alone hides it from real
    # tokens; padding rows keep their diagonal, so no row is ever all -inf.
    pos = torch.arange(t, device=device)
    q, k = pos[:, None], pos[None, :]
    mask = k <= q
    if window is not None:
        mask = mask & (k > q - window)
    return mask[None, None]


def _decode_mask(positions: Tensor, ctx_len: int, window: int | None) -> Tensor:
    k = torch.arange(ctx_len, device=positions.device)[None, :]
    q = positions[:, None]
    mask = k <= q
    if window is not None:
        mask = mask & (k > q - window)
    return mask[:, None, None, :]


GREEDY_BELOW = 1e-5  # temperatures under this sample greedily (vLLM's _SAMPLING_EPS)


def is_greedy(temperature: float) -> bool:
    return temperature < GREEDY_BELOW


def sample(logits: Tensor, temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """Token ids [B] from logits [B, vocab]: argmax at temperature 0, else nucleus sampling.

    Sampling is an exponential race (argmax of p / Exp(1) noise), which draws from p
    exactly without a data-dependent shape; `generator` must live on the logits' device.
    A temperature below GREEDY_BELOW is argmax too, as vLLM does: dividing by it would take
    the logits past float32's range (1e-40 makes every logit inf and softmax NaN), and the
    distribution it asks for is argmax to within float precision anyway.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if is_greedy(temperature):
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1:
        ordered, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is short.
        keep = (ordered.cumsum(dim=-1) - ordered) < top_p
        probs = probs * torch.zeros_like(keep).scatter(-1, order, keep)
    noise = torch.empty_like(probs).exponential_(generator=generator).clamp_min(torch.finfo(torch.float32).tiny)
    return (probs / noise).argmax(dim=-1)


def generate(
    model: Llama,
    cache: KVCache,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    attn_impl: str = "sdpa",
) -> list[list[int]]:
    """Generate `max_new_tokens` per prompt (no stop tokens), prompts in slots 0..B-1.

    A reference loop for tests and demos: pads only to the longest prompt and decodes
    over the whole cache; the engine pads to its buckets instead.
    """
    lengths_list = [len(p) for p in prompt_ids]
    if not prompt_ids or min(lengths_list) == 0 or max_new_tokens <= 0:
        raise ValueError("generate needs at least one non-empty prompt and max_new_tokens > 0")
    if len(prompt_ids) > cache.num_slots or max(lengths_list) + max_new_tokens > cache.max_model_len:
        raise ValueError(
            f"{len(prompt_ids)} prompts of up to {max(lengths_list)} tokens + {max_new_tokens} "
            f"new do not fit a cache of {cache.num_slots} slots x {cache.max_model_len} tokens"
        )
    device = model.embed_tokens.weight.device
    t = max(lengths_list)
    ids = torch.tensor([p + [0] * (t - len(p)) for p in prompt_ids], device=device)
    lengths = torch.tensor(lengths_list, device=device)
    slots = torch.arange(len(prompt_ids), device=device)
    logits = model.prefill(ids, lengths, slots, cache, attn_impl)
    out = []
    for step in range(max_new_tokens):
        token = sample(logits, temperature, top_p, generator)
        out.append(token)
        if step + 1 < max_new_tokens:
            logits = model.decode(token, lengths + step, slots, cache, cache.max_model_len, attn_impl)
    return torch.stack(out, dim=1).tolist()
