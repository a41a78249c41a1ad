"""prebake's FP8 against an independent reference of the same scheme, on SmolLM2-135M-Instruct.

    python benchmarks/fp8_reference.py [--tokens N] [--window W] [--work DIR]

The scheme (issue 47): W8A8, weight scales per output row and activation scales per token of
amax / 448, float8_e4m3fn round to nearest, fp32 products, bf16 out; embeddings, norms and lm_head
in bf16. The reference: the scheme in plain torch, fake-quant (quantize, dequantize to fp32, an fp32
matmul), from the bf16 weights, unfused, importing nothing of prebake's FP8 code. Measured:

1. linear by linear: each FP8 linear of prebake's fp8 model on the very input it saw, against the
   reference on that input (weight bytes, scales, bitwise equal outputs); compressed-tensors' own
   quantize of the weights against prebake's bytes;
2. model by model over benchmarks/fp8_accuracy.py's text (the reference's linears in prebake's
   runtime and in transformers' Llama, itself a second bf16 implementation): top-1 agreement of
   each pair with a Wilson 95% interval;
3. last-bit variants no scheme fixes: x / scale or x * (1 / scale), weight scales in fp32 or bf16.

The last line is one JSON object. Figures: docs/fp8.md ("Checked against an independent reference").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ is no package
from benchmarks.fp8_accuracy import TEXT, hf_folder, perplexity, tokens, wilson, window_logits
from prebake.artifacts.recipe.schema import ModelSpec, load_recipe

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from prebake.engine.bundled.runtime.model import Llama

E4M3_MAX = 448.0  # float8_e4m3fn's largest finite value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--work", type=Path, default=Path("/tmp/prebake-fp8-accuracy"))
    args = parser.parse_args()
    import torch

    from prebake.engine.bundled.runtime.loader import load_model
    from prebake.engine.bundled.runtime.weights import load_hf_folder

    folder = hf_folder(args.work)
    text_path = next(TEXT.glob("matplotlib-*.dist-info/LICENSE"))
    ids = tokens(folder, text_path.read_text(), args.tokens)
    spec = ModelSpec(name="smollm2-135m", weights=str(folder), config=load_recipe("smollm2-135m").model.config)
    _, bf16_state = load_hf_folder(folder, torch.bfloat16)

    prebake_fp8 = load_model(spec, "fp8", log=print)
    linears = linear_by_linear(prebake_fp8, bf16_state, ids[: args.window])
    for name, row in linears["worst"].items():
        print(f"linear {name:28s} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    print("linears", json.dumps(linears["summary"]))

    logits: dict[str, list[Tensor]] = {}

    def run(name: str, model: Any, forward: Callable = window_logits) -> None:
        logits[name] = forward(model, ids, args.window)
        print(f"{name}: perplexity {perplexity(logits[name], ids, args.window):.4f}", flush=True)

    run("prebake bf16", load_model(spec, "bf16", log=print))
    run("prebake fp8", prebake_fp8)
    run("prebake fp32", load_model(spec, "fp32", log=print))
    for variant in VARIANTS:
        run(
            f"reference fp8 in prebake's runtime ({variant})", with_reference_linears(load_model(spec, "bf16"), variant)
        )
    hf = transformers_model(folder)
    run("transformers bf16", hf, hf_window_logits)
    run(
        "reference fp8 in transformers (div, fp32 scale)",
        with_reference_linears(hf, "div, fp32 scale"),
        hf_window_logits,
    )

    pairs = [
        ("prebake fp8", "reference fp8 in prebake's runtime (div, fp32 scale)"),
        ("prebake fp8", "reference fp8 in transformers (div, fp32 scale)"),
        *((name, "prebake bf16") for name in logits if name != "prebake bf16"),
        ("reference fp8 in transformers (div, fp32 scale)", "transformers bf16"),
        ("prebake fp8", "prebake fp32"),
        ("prebake bf16", "prebake fp32"),
    ]
    figures: dict[str, Any] = {"linears": linears["summary"], "perplexity": {}, "agreement": {}}
    for name, rows in logits.items():
        figures["perplexity"][name] = perplexity(rows, ids, args.window)
    for a, b in pairs:
        row = compare(torch.cat(logits[a]), torch.cat(logits[b]))
        figures["agreement"][f"{a} | {b}"] = row
        low, high = row["wilson95"]
        print(f"{a:52s} vs {b:40s} top-1 {row['top1_agreement']:.2%} [{low:.1%}, {high:.1%}]  "
              f"max |dlogit| {row['max_abs_logit_diff']:.3f}")  # fmt: skip
    print(json.dumps({"text": str(text_path), "tokens": len(ids), "window": args.window, **figures}))


# --- the reference: plain torch, nothing of prebake's FP8 code --------------------------------------------

VARIANTS = ("div, fp32 scale", "reciprocal, fp32 scale", "div, bf16 weight scale")


def fake_quant_rows(x: Tensor, *, reciprocal: bool = False, scale_dtype: torch.dtype | None = None) -> Tensor:
    """`x` quantized to float8_e4m3fn per row (scale amax / 448, round to nearest, saturated) and
    dequantized to fp32. `reciprocal`: x * (1 / scale) as vLLM's kernels compute it, not x / scale;
    `scale_dtype`: the scale rounded to that dtype first (compressed-tensors stores it in bf16)."""
    import torch

    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
    if scale_dtype is not None:
        scale = scale.to(scale_dtype).float()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    scaled = xf * (1.0 / scale) if reciprocal else xf / scale
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale


def reference_linear(weight: Tensor, variant: str) -> nn.Module:
    """One W8A8 linear of the scheme as fake-quant: y = (fq(x) @ fq(W).T in fp32) in x's dtype."""
    import torch

    reciprocal = variant.startswith("reciprocal")
    scale_dtype = torch.bfloat16 if "bf16 weight scale" in variant else None
    dequantized = fake_quant_rows(weight, reciprocal=reciprocal, scale_dtype=scale_dtype)

    class ReferenceW8A8(torch.nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return (fake_quant_rows(x, reciprocal=reciprocal) @ dequantized.t()).to(x.dtype)

    return ReferenceW8A8()


QUANTIZED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def with_reference_linears(model: nn.Module, variant: str) -> nn.Module:
    """A bf16 model (prebake's Llama or transformers' LlamaForCausalLM) with each decoder linear
    replaced by the reference's, in place; lm_head, embeddings and norms untouched."""
    layers = model.get_submodule("layers" if hasattr(model, "layers") else "model.layers")
    for layer in layers.children():
        for path in QUANTIZED:
            parent_name, _, child = path.rpartition(".")
            parent = layer.get_submodule(parent_name)
            setattr(parent, child, reference_linear(getattr(parent, child).weight.detach(), variant))
    return model


def transformers_model(folder: Path) -> nn.Module:
    """The same bf16 folder in transformers' own Llama (sdpa attention): a second bf16 implementation."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa").eval()


def hf_window_logits(model: nn.Module, ids: list[int], window: int) -> list[Tensor]:
    import torch

    with torch.no_grad():
        return [
            model(torch.tensor([ids[start : start + window]])).logits[0].float()
            for start in range(0, len(ids) - window + 1, window)
        ]


# --- linear by linear ------------------------------------------------------------------------------------


def linear_by_linear(model: Llama, bf16_state: dict[str, Tensor], ids: list[int]) -> dict[str, Any]:
    """Every Fp8Linear of prebake's `model` on the inputs it sees over `ids`, against the reference on
    the same inputs: weight bytes, scales, outputs."""
    import torch

    from prebake.engine.bundled.runtime.fp8_linear import Fp8Linear
    from prebake.engine.bundled.runtime.fp8_load import FUSED

    seen: dict[str, tuple[Tensor, Tensor]] = {}
    hooks = [
        module.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, (i[0], o)))
        for name, module in model.named_modules()
        if isinstance(module, Fp8Linear)
    ]
    with torch.no_grad():
        window_logits(model, ids, len(ids))
    for hook in hooks:
        hook.remove()
    rows: dict[str, dict[str, Any]] = {}
    for name, (x, out) in seen.items():
        module = cast(Fp8Linear, model.get_submodule(name))
        layer, fused = name.split(".", 2)[1], name.split(".", 2)[2]
        weight = torch.cat([bf16_state[f"layers.{layer}.{shard}.weight"] for shard in FUSED[fused]])
        wf = weight.float()
        scale = wf.abs().amax(dim=1) / E4M3_MAX
        codes = (wf / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        product = fake_quant_rows(x.reshape(-1, x.shape[-1])) @ (codes.float() * scale[:, None]).t()
        reference, got = product.to(out.dtype), out.reshape(product.shape)
        steps = (got.float() - reference.float()).abs() / _bf16_step(reference)
        rows[name] = {
            "weight_bytes_equal": bool(torch.equal(module.weight.view(torch.uint8), codes.view(torch.uint8))),
            "scales_equal": bool(torch.equal(module.weight_scale, scale)),
            "output_bitwise_equal": round(float((got == reference).float().mean()), 6),
            "max_bf16_steps": float(steps.max()),
            "rel_err_vs_fp32_product": float((got.float() - product).norm() / product.norm()),
        }
    worst = sorted(rows, key=lambda n: (rows[n]["output_bitwise_equal"], -rows[n]["max_bf16_steps"]))[:3]
    summary = {
        "linears": len(rows),
        "weight_bytes_equal": sum(r["weight_bytes_equal"] for r in rows.values()),
        "scales_equal": sum(r["scales_equal"] for r in rows.values()),
        "output_bitwise_equal_min": min(r["output_bitwise_equal"] for r in rows.values()),
        "output_bitwise_equal_mean": sum(r["output_bitwise_equal"] for r in rows.values()) / len(rows),
        "max_bf16_steps": max(r["max_bf16_steps"] for r in rows.values()),
        "compressed_tensors_weight_bytes_equal": compressed_tensors_agrees(model, bf16_state),
    }
    return {"summary": summary, "worst": {n: rows[n] for n in worst}}


def _bf16_step(t: Tensor) -> Tensor:
    """The spacing of bf16 numbers at each value of `t` (its unit in the last place)."""
    import torch

    mag = t.float().abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


def compressed_tensors_agrees(model: nn.Module, bf16_state: dict[str, Tensor]) -> str:
    """compressed-tensors' own channel FP8 quantize (its calculate_qparams on fp32 amax, its quantize),
    against prebake's weight bytes: how many of the fused linears' shards are byte-equal."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    from prebake.engine.bundled.runtime.fp8_load import FUSED

    args = QuantizationArgs(num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False)
    equal = total = 0
    for name, module in model.named_modules():
        if not hasattr(module, "weight_scale"):
            continue
        layer, fused = name.split(".", 2)[1], name.split(".", 2)[2]
        offset = 0
        for shard in FUSED[fused]:
            w = bf16_state[f"layers.{layer}.{shard}.weight"].float()
            amax = w.abs().amax(dim=1, keepdim=True)
            scale, zero = calculate_qparams(-amax, amax, args)
            codes = quantize(w, scale, zero, args, dtype=torch.float8_e4m3fn)
            ours = module.weight[offset : offset + w.shape[0]]
            equal += int(torch.equal(codes.view(torch.uint8), ours.view(torch.uint8)))
            total += 1
            offset += w.shape[0]
    return f"{equal} of {total}"


def compare(logits: Tensor, reference: Tensor) -> dict[str, Any]:
    agree = (logits.argmax(-1) == reference.argmax(-1)).float()
    n, k = len(agree), int(agree.sum())
    return {
        "top1_agreement": k / n,
        "agree": k,
        "positions": n,
        "wilson95": wilson(k, n),
        "max_abs_logit_diff": float((logits - reference).abs().max()),
    }


if __name__ == "__main__":
    main()
