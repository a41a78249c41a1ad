"""Tiny FP8 checkpoints in every format prebake reads, written here from seeded weights (no hub), and
each one's dequantized twin: the plain state dict its FP8 tensors stand for.

    write_checkpoint(folder, fmt) -> twin     fmt: one of FORMATS below
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from prebake.engine.bundled.runtime.fp8_linear import FP8, FP8_MAX, quantize_rows
from prebake.engine.bundled.runtime.weights import LlamaConfig, hf_name, tiny_random_weights

HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
CONFIG = LlamaConfig.from_hf(HF_CONFIG)
BLOCK = [32, 32]
STATIC_INPUT_SCALE = 0.02  # what a calibration would find for activations of about unit size
FORMATS = ("vllm-fp8-dynamic", "vllm-fp8-static", "ct-channel", "ct-tensor-static", "block-fp8", "modelopt")


def plain_weights() -> dict[str, Tensor]:
    return tiny_random_weights(CONFIG, seed=3)


def write_plain(folder: Path, state: dict[str, Tensor], quantization: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = {**HF_CONFIG, **({"quantization_config": quantization} if quantization else {})}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))


def write_checkpoint(folder: Path, fmt: str) -> dict[str, Tensor]:
    """Write the `fmt` checkpoint of plain_weights() into `folder`; its dequantized twin (runtime names)."""
    stored, twin = {}, {}
    for name, value in plain_weights().items():
        if name.startswith("layers.") and name.endswith("_proj.weight"):
            tensors, dequantized = _quantize(hf_name(name), value, fmt)
            stored.update(tensors)
            twin[name] = dequantized
        else:
            stored[hf_name(name)] = value.to(torch.bfloat16)
            twin[name] = value.to(torch.bfloat16).float()
    write_plain(folder, stored, _config(fmt))
    if fmt == "modelopt":
        quant = {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
        (folder / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt"}, "quantization": quant})
        )
    return twin


def _quantize(name: str, weight: Tensor, fmt: str) -> tuple[dict[str, Tensor], Tensor]:
    module = name.removesuffix(".weight")
    if fmt == "block-fp8":
        q, grid = _quantize_blocks(weight)
        full = grid.repeat_interleave(BLOCK[0], 0)[: weight.shape[0]].repeat_interleave(BLOCK[1], 1)[
            :, : weight.shape[1]
        ]
        return {name: q, f"{module}.weight_scale_inv": grid}, q.float() * full
    if fmt == "ct-channel":
        q, scale = quantize_rows(weight)
        return {name: q, f"{module}.weight_scale": scale[:, None].to(torch.bfloat16)}, q.float() * scale[:, None].to(
            torch.bfloat16
        ).float()
    scale = weight.abs().max() / FP8_MAX
    q = (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    tensors = {name: q, f"{module}.weight_scale": scale.reshape(() if fmt.startswith("vllm") else (1,))}
    if fmt in ("vllm-fp8-static", "ct-tensor-static", "modelopt"):
        tensors[f"{module}.input_scale"] = torch.tensor(STATIC_INPUT_SCALE).reshape(
            () if fmt != "ct-tensor-static" else (1,)
        )
    return tensors, q.float() * scale


def _quantize_blocks(weight: Tensor) -> tuple[Tensor, Tensor]:
    n, k = weight.shape
    grid = torch.empty(math.ceil(n / BLOCK[0]), math.ceil(k / BLOCK[1]))
    q = torch.empty(n, k, dtype=FP8)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            rows, cols = slice(i * BLOCK[0], (i + 1) * BLOCK[0]), slice(j * BLOCK[1], (j + 1) * BLOCK[1])
            grid[i, j] = weight[rows, cols].abs().max() / FP8_MAX
            q[rows, cols] = (weight[rows, cols] / grid[i, j]).to(FP8)
    return q, grid


def _config(fmt: str) -> dict | None:
    if fmt.startswith("vllm"):
        return {"quant_method": "fp8", "activation_scheme": "static" if fmt.endswith("static") else "dynamic"}
    if fmt == "block-fp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": BLOCK}
    if fmt.startswith("ct-"):
        static = fmt.endswith("static")
        weights = {"num_bits": 8, "type": "float", "strategy": "channel" if fmt == "ct-channel" else "tensor"}
        acts = {"num_bits": 8, "type": "float", "strategy": "tensor" if static else "token", "dynamic": not static}
        group = {"targets": ["Linear"], "weights": weights, "input_activations": acts}
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": group},
            "ignore": ["lm_head"],
        }
    return None  # modelopt: hf_quant_config.json


def save_fp8_dynamic_by_compressed_tensors(model: Any, folder: Path) -> None:
    """`model` (a transformers Llama) quantized to FP8_DYNAMIC and saved by compressed-tensors itself:
    its preset scheme, its scale maths (calculate_qparams), its compressor and config writer."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in model.modules():
        args = getattr(module, "quantization_scheme", None)
        if args is None or args.weights is None:
            continue
        w = module.weight.detach().float()
        scale, zero = calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True), args.weights)
        module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype))
        module.weight_zero_point.data.copy_(zero.to(module.weight_zero_point.dtype))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(folder)
