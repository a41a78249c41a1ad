"""A checkpoint made by a tool no one here wrote: compressed-tensors 0.20 (llm-compressor's library,
from PyPI) quantizes a transformers Llama to FP8_DYNAMIC with its own scale maths and writes it with
its own compressor; prebake reads it as compressed-tensors per-channel / per-token and serves logits
that agree with transformers' bf16 model of the same weights."""

from __future__ import annotations

import compressed_tensors as ct  # the dev extra has it: a missing package fails, not skips
import torch
import transformers

from prebake.artifacts.recipe.quantization import read_scheme
from prebake.engine.bundled.runtime.fp8_linear import Fp8Linear
from prebake.engine.bundled.runtime.fp8_load import build_fp8_model, read_fp8_folder
from prebake.engine.bundled.runtime.model import KVCache
from prebake.engine.bundled.runtime.weights import hf_name
from tests.support.fp8_checkpoints import CONFIG, HF_CONFIG, plain_weights, save_fp8_dynamic_by_compressed_tensors

PROMPT = [5, 17, 200, 42, 7, 99, 3, 64]


def _hf_model():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_CONFIG)).to(torch.bfloat16)
    model.load_state_dict({hf_name(k): v.to(torch.bfloat16) for k, v in plain_weights().items()}, strict=False)
    return model.eval()


def _fp8_dynamic_by_compressed_tensors(folder) -> None:
    save_fp8_dynamic_by_compressed_tensors(_hf_model(), folder)


def test_prebake_serves_a_compressed_tensors_fp8_dynamic_checkpoint(tmp_path):
    assert ct.__version__.startswith("0.20")
    _fp8_dynamic_by_compressed_tensors(tmp_path)
    scheme = read_scheme(tmp_path)
    assert (scheme.format, scheme.weights, scheme.activations) == ("compressed-tensors", "channel", "token")
    config, weights = read_fp8_folder(tmp_path, scheme, torch.bfloat16)
    model = build_fp8_model(config, weights, scheme, torch.bfloat16)
    assert isinstance(model.layers[0].self_attn.qkv_proj, Fp8Linear)

    cache = KVCache.allocate(CONFIG, 1, 16, dtype=torch.bfloat16)
    got = model.prefill(torch.tensor([PROMPT]), torch.tensor([len(PROMPT)]), torch.tensor([0]), cache)[0]
    with torch.no_grad():
        want = _hf_model().float()(torch.tensor([PROMPT])).logits[0, -1]
    cosine = torch.nn.functional.cosine_similarity(got.float(), want.float(), dim=0)
    assert cosine > 0.99 and int(got.argmax()) == int(want.argmax()), float(cosine)
