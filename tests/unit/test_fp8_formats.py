"""FP8 checkpoints in every format prebake reads (written by tests/support/fp8_checkpoints.py): each
serves the logits of its dequantized bf16 twin within FP8's tolerance, bad scales are refused naming
the tensor, quantize-on-load equals the same weights quantized offline, and an FP8 checkpoint served
at bf16 is dequantized at load and says so."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from prebake.artifacts.recipe.quantization import QUANTIZE_ON_LOAD, RANDOM_FP8, QuantizationError, read_scheme
from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.checkpoint import checkpoint_folder, seeded_tensors
from prebake.engine.bundled.runtime.fp8_linear import Fp8Linear, QuantLinear, fuse, quantize_rows
from prebake.engine.bundled.runtime.fp8_load import build_fp8_model, quantize_on_load, read_fp8_folder
from prebake.engine.bundled.runtime.loader import load_model
from prebake.engine.bundled.runtime.model import KVCache, build_model
from tests.support.fp8_checkpoints import CONFIG, FORMATS, HF_CONFIG, plain_weights, write_checkpoint, write_plain

PROMPT = torch.tensor([[5, 17, 200, 42, 7, 99, 3, 64]])


def _logits(model) -> torch.Tensor:
    cache = KVCache.allocate(CONFIG, 1, 16, dtype=torch.bfloat16)
    return model.prefill(PROMPT, torch.tensor([PROMPT.shape[1]]), torch.tensor([0]), cache)[0]


def _fp8(folder):
    scheme = read_scheme(folder)
    config, weights = read_fp8_folder(folder, scheme, torch.bfloat16)
    return build_fp8_model(config, weights, scheme, torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_serves_its_dequantized_twins_logits_within_fp8_tolerance(tmp_path, fmt):
    twin = write_checkpoint(tmp_path, fmt)
    got, want = _logits(_fp8(tmp_path)), _logits(build_model(CONFIG, twin, torch.bfloat16))
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=0)
    assert cosine > 0.995 and int(got.argmax()) == int(want.argmax()), (fmt, float(cosine))


def test_each_format_is_read_as_the_scheme_its_config_names(tmp_path):
    schemes = {}
    for fmt in FORMATS:
        write_checkpoint(tmp_path / fmt, fmt)
        s = read_scheme(tmp_path / fmt)
        schemes[fmt] = (s.format, s.weights, s.activations)
    assert schemes == {
        "vllm-fp8-dynamic": ("autofp8", "tensor", "token"),
        "vllm-fp8-static": ("autofp8", "tensor", "tensor"),
        "ct-channel": ("compressed-tensors", "channel", "token"),
        "ct-tensor-static": ("compressed-tensors", "tensor", "tensor"),
        "block-fp8": ("block-fp8", "block", "token"),
        "modelopt": ("modelopt", "tensor", "tensor"),
    }


def test_fp8_linears_are_fused_and_lm_head_embeddings_norms_stay_in_the_model_dtype(tmp_path):
    write_checkpoint(tmp_path, "vllm-fp8-static")
    model = _fp8(tmp_path)
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    assert isinstance(attn.qkv_proj, Fp8Linear) and isinstance(mlp.gate_up_proj, Fp8Linear)
    assert attn.qkv_proj.weight.dtype == torch.float8_e4m3fn and attn.qkv_proj.input_scale is not None
    assert isinstance(model.lm_head, nn.Linear) and model.lm_head.weight.dtype == torch.bfloat16
    assert model.embed_tokens.weight.dtype == model.norm.weight.dtype == torch.bfloat16


def test_block_fp8_is_dequantized_at_load_into_plain_linears(tmp_path):
    write_checkpoint(tmp_path, "block-fp8")
    model = _fp8(tmp_path)
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())


def test_per_tensor_shards_are_requantized_to_the_largest_scale_as_vllm_fuses_them():
    w = torch.randn(8, 16)
    shards = []
    for scale in (0.01, 0.04):
        q = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        shards.append(QuantLinear(q, torch.tensor([scale])))
    fused = fuse(shards)
    assert fused.scale.tolist() == [pytest.approx(0.04)]
    assert torch.allclose(
        fused.dequantize(torch.float32)[:8], shards[0].dequantize(torch.float32), rtol=0.07, atol=1e-3
    )
    assert torch.equal(fused.weight[8:].float(), shards[1].weight.float())  # the largest shard is unchanged


def test_ignored_modules_stay_plain(tmp_path):
    write_checkpoint(tmp_path, "ct-channel")
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["ignore"] = ["lm_head", "re:.*mlp.down_proj$"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(tmp_path / "model.safetensors")
    for i in range(CONFIG.num_hidden_layers):
        name = f"model.layers.{i}.mlp.down_proj"
        tensors[f"{name}.weight"] = (
            tensors[f"{name}.weight"].float() * tensors.pop(f"{name}.weight_scale").float()
        ).to(torch.bfloat16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = _fp8(tmp_path)
    assert isinstance(model.layers[1].mlp.down_proj, nn.Linear) and isinstance(
        model.layers[1].mlp.gate_up_proj, Fp8Linear
    )


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (torch.tensor(0.0), "zero, negative"),
        (torch.tensor(-0.01), "zero, negative"),
        (torch.tensor(float("nan")), "NaN"),
        (torch.ones(2, 2), "has shape"),
        (None, "is missing"),
    ],
)
def test_a_bad_scale_is_refused_naming_the_tensor(tmp_path, bad, says):
    write_checkpoint(tmp_path, "vllm-fp8-static")
    tensors = load_file(tmp_path / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight_scale"
    if bad is None:
        del tensors[name]
    else:
        tensors[name] = bad
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(QuantizationError, match=says) as refused:
        _fp8(tmp_path)
    assert name in str(refused.value) and "bug" not in str(refused.value)


def test_quantize_on_load_equals_the_same_weights_quantized_offline(tmp_path):
    plain = {k: v.to(torch.bfloat16) for k, v in plain_weights().items()}
    write_plain(tmp_path / "plain", {f"model.{k}" if k != "lm_head.weight" else k: v for k, v in plain.items()})
    offline = {}
    for name, value in plain.items():
        hf = name if name == "lm_head.weight" else f"model.{name}"
        if name.startswith("layers.") and name.endswith("_proj.weight"):
            q, scale = quantize_rows(value)
            offline.update({hf: q, hf.removesuffix("weight") + "weight_scale": scale[:, None]})
        else:
            offline[hf] = value
    quant = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ["lm_head"],
        "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
    }
    write_plain(tmp_path / "offline", offline, quant)

    on_load = load_model(ModelSpec(name="t", weights=str(tmp_path / "plain"), config=HF_CONFIG), "fp8", log=print)
    loaded = load_model(ModelSpec(name="t", weights=str(tmp_path / "offline"), config=HF_CONFIG), "fp8", log=print)
    a, b = on_load.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k].float(), b[k].float()) for k in a)
    assert torch.equal(_logits(on_load), _logits(loaded))
    direct = quantize_on_load(CONFIG, plain, QUANTIZE_ON_LOAD)
    assert torch.equal(
        direct.linears["layers.0.self_attn.qkv_proj"].weight.float(), a["layers.0.self_attn.qkv_proj.weight"].float()
    )


def test_an_fp8_checkpoint_served_at_bf16_is_dequantized_at_load_and_says_so(tmp_path):
    twin = write_checkpoint(tmp_path, "ct-channel")
    lines: list[str] = []
    model = load_model(ModelSpec(name="t", weights=str(tmp_path), config=HF_CONFIG), "bf16", log=lines.append)
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())
    assert len(lines) == 1 and "FP8 checkpoint (compressed-tensors" in lines[0] and "dequantized at load" in lines[0]
    assert torch.equal(_logits(model), _logits(build_model(CONFIG, twin, torch.bfloat16)))


def test_a_scheme_of_static_scales_is_not_made_up_on_load():
    static = QUANTIZE_ON_LOAD.__class__("modelopt", "tensor", "tensor")
    with pytest.raises(QuantizationError, match="static activation scales.*input_scale"):
        quantize_on_load(CONFIG, plain_weights(), static)


def test_an_unread_quant_method_names_the_ones_read(tmp_path):
    write_plain(tmp_path, {}, {"quant_method": "awq", "bits": 4})
    with pytest.raises(QuantizationError, match="quant_method 'awq' is not an FP8 format.*compressed-tensors"):
        read_scheme(tmp_path)


def test_a_random_checkpoints_fp8_twin_is_written_once_and_equals_quantizing_its_values_on_load(tmp_path):
    spec = ModelSpec(name="t", weights="random-checkpoint", config=HF_CONFIG, seed=1)
    lines: list[str] = []
    model = load_model(spec, "fp8", home=tmp_path, log=lines.append)
    assert len(lines) == 1 and "random FP8 checkpoint once" in lines[0]
    folder = checkpoint_folder(spec, tmp_path, fp8=True)
    assert read_scheme(folder) == RANDOM_FP8 and folder != checkpoint_folder(spec, tmp_path)
    seeded = dict(seeded_tensors(CONFIG, 1, torch.bfloat16))
    on_load = build_fp8_model(CONFIG, quantize_on_load(CONFIG, seeded, RANDOM_FP8), RANDOM_FP8, torch.bfloat16)
    a, b = model.state_dict(), on_load.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k].float(), b[k].float()) for k in a)
    load_model(spec, "fp8", home=tmp_path, log=lambda line: pytest.fail(f"a second load wrote: {line}"))
