"""FP8 models: which linears are FP8 under a scheme, read from a checkpoint, quantized on load, or
dequantized for a bf16 serve; and the runtime built from them.

    runtime module names of an FP8 layer i     (fused as vLLM fuses them)
        layers.i.self_attn.qkv_proj   q, k, v  Fp8Linear
        layers.i.self_attn.o_proj              Fp8Linear
        layers.i.mlp.gate_up_proj     gate, up Fp8Linear
        layers.i.mlp.down_proj                 Fp8Linear
    excluded modules, embeddings, norms, lm_head: plain tensors in the model dtype

Each format is read by its own module (fp8_autofp8, fp8_compressed_tensors, fp8_block, fp8_modelopt);
this one dispatches, fuses and places, and dequantizes a quantized embedding or lm_head.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from prebake.artifacts.recipe.quantization import Fp8Scheme, QuantizationError
from prebake.engine.bundled.runtime import fp8_autofp8, fp8_block, fp8_compressed_tensors, fp8_modelopt
from prebake.engine.bundled.runtime.fp8_linear import FP8, Fp8Linear, QuantLinear, fuse, quantize_rows
from prebake.engine.bundled.runtime.fp8_source import CheckpointTensors
from prebake.engine.bundled.runtime.model import Llama, SkipInit, rope_inv_freq
from prebake.engine.bundled.runtime.safetensors_files import weight_files
from prebake.engine.bundled.runtime.weights import (
    LlamaConfig,
    check_state_dict,
    hf_name,
    parameter_shapes,
    read_config,
)

# fused runtime module -> the checkpoint modules it stacks, in order
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}  # fmt: skip
_READERS: dict[str, Callable[[CheckpointTensors, str, Fp8Scheme], QuantLinear]] = {
    "autofp8": fp8_autofp8.read_linear,
    "compressed-tensors": fp8_compressed_tensors.read_linear,
    "modelopt": fp8_modelopt.read_linear,
}


@dataclass(frozen=True)
class Fp8Weights:
    """A model's tensors at precision fp8: `dense` by runtime name in the model dtype, `linears` by
    fused runtime module name (FUSED)."""

    dense: dict[str, Tensor]
    linears: dict[str, QuantLinear]


def fp8_modules(config: LlamaConfig, scheme: Fp8Scheme) -> list[str]:
    """The runtime modules that are Fp8Linear under `scheme`, by fused name; a fused group whose
    shards are partly excluded is refused (vLLM refuses it too)."""
    if scheme.weights == "block":  # dequantized at load: no platform here has a block kernel
        return []
    modules = []
    for i in range(config.num_hidden_layers):
        for fused, shards in FUSED.items():
            excluded = [scheme.excludes(f"model.layers.{i}.{s}") for s in shards]
            if any(excluded) and not all(excluded):
                raise QuantizationError(
                    f"layer {i}: {', '.join(shards)} are served as one linear but the checkpoint quantizes only "
                    f"some of them; quantize all or none"
                )
            if not any(excluded):
                modules.append(f"layers.{i}.{fused}")
    return modules


def fp8_skeleton(config: LlamaConfig, scheme: Fp8Scheme, dtype: torch.dtype) -> Llama:
    """The runtime on the meta device with Fp8Linear where `scheme` puts FP8 (weights yet unbound)."""
    with torch.device("meta"), SkipInit():
        model = Llama(config, dtype)
        for name in fp8_modules(config, scheme):
            _place(model, name, scheme, dtype)
    return model


def _place(model: Llama, name: str, scheme: Fp8Scheme, dtype: torch.dtype) -> None:
    """An Fp8Linear in place of the plain linears the fused module `name` stands for."""
    parent_name, _, fused = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    shard_names = [s.rpartition(".")[2] for s in FUSED[name.split(".", 2)[2]]]
    shards = [cast(nn.Linear, parent.get_submodule(s)) for s in shard_names]
    linear = Fp8Linear(
        shards[0].in_features,
        sum(s.out_features for s in shards),
        bias=shards[0].bias is not None,
        static=scheme.activations == "tensor",
        dtype=dtype,
    )
    for shard in shard_names:
        delattr(parent, shard)
    setattr(parent, fused, linear)


def build_fp8_model(
    config: LlamaConfig, weights: Fp8Weights, scheme: Fp8Scheme, dtype: torch.dtype, device: str = "cpu"
) -> Llama:
    """The runtime in eval mode serving `weights` under `scheme`; no gradients."""
    model = fp8_skeleton(config, scheme, dtype)
    state = {k: v.to(device=device, dtype=dtype).contiguous() for k, v in weights.dense.items()}
    for name, linear in weights.linears.items():
        state.update({f"{name}.{k}": v.to(device) for k, v in Fp8Linear.state_of(linear, dtype).items()})
    model.load_state_dict(state, strict=True, assign=True)
    model.inv_freq = rope_inv_freq(config).to(device)
    return model.eval().requires_grad_(False)


def quantize_on_load(
    config: LlamaConfig, state: Mapping[str, Tensor], scheme: Fp8Scheme, *, static_input_scale: float | None = None
) -> Fp8Weights:
    """A plain checkpoint's state dict (runtime names) as FP8: every linear `scheme` does not exclude
    quantized per channel (vLLM's --quantization fp8 with per-channel scales), then fused. A scheme of
    static activation scales needs them calibrated: only a timing model passes `static_input_scale`."""
    check_state_dict(config, state)
    if scheme.activations == "tensor" and static_input_scale is None:
        raise QuantizationError(
            f"a {scheme.format} scheme has static activation scales, which quantizing on load cannot calibrate; "
            f"serve an FP8 checkpoint that holds its input_scale tensors, or a plain one (dynamic scales)"
        )
    input_scale = torch.tensor([float(static_input_scale or 1.0)]) if scheme.activations == "tensor" else None
    quantized = set(fp8_modules(config, scheme))
    dense = {k: v for k, v in state.items() if _fused_name(k) not in quantized}
    linears = {}
    for name in sorted(quantized):
        layer, fused = name.split(".", 2)[1], name.split(".", 2)[2]
        shards = []
        for shard in FUSED[fused]:
            weight, scale = quantize_rows(state[f"layers.{layer}.{shard}.weight"])
            bias = state.get(f"layers.{layer}.{shard}.bias")
            shards.append(QuantLinear(weight, scale, input_scale, bias))
        linears[name] = fuse(shards)
    return Fp8Weights(dense, linears)


def dequantized(config: LlamaConfig, weights: Fp8Weights, dtype: torch.dtype) -> dict[str, Tensor]:
    """An FP8 model's tensors as a plain state dict in `dtype` (fused linears split back)."""
    shapes = parameter_shapes(config)
    state = {k: v.to(dtype) for k, v in weights.dense.items()}
    for name, linear in weights.linears.items():
        layer, fused = name.split(".", 2)[1], name.split(".", 2)[2]
        names = [f"layers.{layer}.{shard}" for shard in FUSED[fused]]
        sizes = [shapes[f"{n}.weight"][0] for n in names]
        for n, part in zip(names, linear.dequantize(dtype).split(sizes)):
            state[f"{n}.weight"] = part
        if linear.bias is not None:
            for n, part in zip(names, linear.bias.split(sizes)):
                state[f"{n}.bias"] = part.to(dtype)
    return state


def read_fp8_folder(folder: Path, scheme: Fp8Scheme, dtype: torch.dtype) -> tuple[LlamaConfig, Fp8Weights]:
    """An FP8 checkpoint folder (config.json, safetensors) read in its format's module, fused."""
    config = read_config(folder)
    quantized = set(fp8_modules(config, scheme))
    with CheckpointTensors([file for file, _ in weight_files(folder)]) as tensors:
        dense = _dense(config, tensors, scheme, quantized, dtype)
        linears = {name: _fused(tensors, name, scheme) for name in sorted(quantized)}
    _check_shapes(config, Fp8Weights(dense, linears), str(folder))
    return config, Fp8Weights(dense, linears)


def _dense(
    config: LlamaConfig, tensors: CheckpointTensors, scheme: Fp8Scheme, quantized: set[str], dtype: torch.dtype
) -> dict[str, Tensor]:
    """Every tensor outside the FP8 linears, in `dtype`: an FP8 one (a quantized lm_head, or block FP8's
    linears) dequantized with its scales."""
    dense = {}
    for name in parameter_shapes(config):
        if _fused_name(name) in quantized:
            continue
        source = hf_name(name)
        if name == "lm_head.weight" and not tensors.has(source):
            raise QuantizationError(f"{tensors.folder}: lm_head.weight is missing; the checkpoint is incomplete")
        tensor = tensors.get(source)
        if tensor.dtype == FP8:
            tensor = _dequantize_plain(tensors, source.removesuffix(".weight"), scheme, dtype)
        dense[name] = tensor.to(dtype)
    return dense


def _dequantize_plain(tensors: CheckpointTensors, module: str, scheme: Fp8Scheme, dtype: torch.dtype) -> Tensor:
    if scheme.weights == "block":
        return fp8_block.read_linear(tensors, module, scheme, dtype)
    return _READERS[scheme.format](tensors, module, scheme).dequantize(dtype)


def _fused(tensors: CheckpointTensors, name: str, scheme: Fp8Scheme) -> QuantLinear:
    layer, fused = name.split(".", 2)[1], name.split(".", 2)[2]
    read = _READERS[scheme.format]
    return fuse([read(tensors, f"model.layers.{layer}.{shard}", scheme) for shard in FUSED[fused]])


def _fused_name(runtime_name: str) -> str | None:
    """The fused module a runtime tensor name belongs to (layers.0.self_attn.k_proj.weight ->
    layers.0.self_attn.qkv_proj), or None outside the decoder's linears."""
    parts = runtime_name.split(".")
    if len(parts) < 5 or parts[0] != "layers":
        return None
    shard = f"{parts[2]}.{parts[3]}"
    fused = next((f for f, shards in FUSED.items() if shard in shards), None)
    return None if fused is None else f"layers.{parts[1]}.{fused}"


def _check_shapes(config: LlamaConfig, weights: Fp8Weights, source: str) -> None:
    """Every tensor the config needs, of its shape; fused linears checked against their shards' sum."""
    shapes = parameter_shapes(config)
    for name, linear in weights.linears.items():
        layer, fused = name.split(".", 2)[1], name.split(".", 2)[2]
        shards = [shapes[f"layers.{layer}.{shard}.weight"] for shard in FUSED[fused]]
        wanted = (sum(s[0] for s in shards), shards[0][1])
        if tuple(linear.weight.shape) != wanted:
            raise QuantizationError(
                f"{source}: {name}'s FP8 shards stack to {tuple(linear.weight.shape)}, the config needs {wanted}; "
                f"check that config.json belongs to these weights"
            )
    wrong = [f"{k} {tuple(v.shape)} != {shapes[k]}" for k, v in weights.dense.items() if tuple(v.shape) != shapes[k]]
    if wrong:
        raise QuantizationError(
            f"{source} does not match the {config.model_type} config: {', '.join(wrong[:5])}; "
            f"check that config.json belongs to these weights"
        )
