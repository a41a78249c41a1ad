"""Bucket strategies on real traffic: fit on the first half of the development trace, report on
the second, for llama3-8b's serving limits; the traffic set at several budgets; a chart.

    .venv/bin/python benchmarks/buckets.py [--trace FILE] [--chart docs/images/buckets.png] [--no-shapes]

Prints a table; then, for synthetic traffic of other shapes (tests/support/synthetic_traces.py:
chat, code, busy chat, short chat, long code, mid code, RAG, mixed; fit on the first half of
each, report on the second), the two goals against exponential: the worst figure at a third of
its count, and prefill token waste at its count. Ends with one JSON line of figures (counts, the
four waste figures per strategy, ratios against exponential, and the per-shape goals). The development trace is the Azure LLM inference trace 2023
(conversation), CC-BY 4.0, Patel et al., "Splitwise", ISCA 2024 (see docs/buckets.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prebake.artifacts.buckets.replay import replay
from prebake.artifacts.buckets.report import figures, strategy_set
from prebake.artifacts.buckets.traces import read_trace, split_trace
from prebake.artifacts.buckets.traffic import fit_bucket_set
from prebake.artifacts.recipe.schema import load_recipe
from tests.support.baking import SHARED
from tests.support.synthetic_traces import MIXES, SHAPES, synthetic_requests

TRACE = SHARED / "traces" / "azure-llm-2023-conv.csv"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--chart", type=Path, default=Path("docs/images/buckets.png"))
    parser.add_argument("--no-shapes", action="store_true", help="skip the synthetic traffic shapes")
    args = parser.parse_args()
    limits = load_recipe("llama3-8b").serving
    fit, unseen = split_trace(read_trace(args.trace))
    fit_shapes, eval_shapes = replay(fit, limits), replay(unseen, limits)
    results = {s: figures(strategy_set(s, limits, fit_shapes), eval_shapes) for s in ("exponential", "linear", "pad")}
    exp = results["exponential"]
    budgets = sorted({exp.total // 4, exp.total // 3, exp.total // 2, exp.total, 2 * exp.total})
    for budget in budgets:
        results[f"traffic@{budget}"] = figures(fit_bucket_set(limits, fit_shapes, budget=budget), eval_shapes)
    print(f"{'set':16s} {'buckets':>7s} {'pf_tok':>7s} {'pf_ctx':>7s} {'dc_bat':>7s} {'dc_blk':>7s} unfitted")
    for name, f in results.items():
        print(
            f"{name:16s} {f.total:7d} {f.prefill_tokens:7.1%} {f.prefill_ctx:7.1%} {f.decode_batch:7.1%} "
            f"{f.decode_blocks:7.1%} {f.unfitted}"
        )
    _chart(results, args.chart)
    third, same = results[f"traffic@{exp.total // 3}"], results[f"traffic@{exp.total}"]
    summary: dict[str, dict] = {
        name: {"buckets": f.total, **cast(dict, f.to_json()["waste"]), "unfitted": f.unfitted}
        for name, f in results.items()
    }
    summary["ratios"] = {
        "third_count_over_exp": round(third.total / exp.total, 3),
        "third_worst_figure_over_exp": round(max(getattr(third, k) / max(getattr(exp, k), 1e-12) for k in _FIGURES), 3),
        "same_count_prefill_tokens_over_exp": round(same.prefill_tokens / exp.prefill_tokens, 3),
    }
    if not args.no_shapes:
        summary["shapes"] = _other_shapes(limits)
    print(json.dumps(summary, sort_keys=True))


def _other_shapes(limits) -> dict[str, dict[str, float]]:
    """The goals on traffic of other shapes, each fitted on its first half, reported on its second."""
    print(f"\n{'shape':12s} {'exp pf_tok':>10s} {'third: worst figure / exp':>26s} {'same: pf_tok / exp':>19s}")
    goals = {}
    for kind in [*SHAPES, *MIXES]:
        fit, unseen = split_trace(synthetic_requests(kind, 3000, seed=7))
        fit_shapes, eval_shapes = replay(fit, limits), replay(unseen, limits)
        exp = figures(strategy_set("exponential", limits, None), eval_shapes)
        third = figures(fit_bucket_set(limits, fit_shapes, budget=exp.total // 3), eval_shapes)
        same = figures(fit_bucket_set(limits, fit_shapes, budget=exp.total), eval_shapes)
        worst = max(_FIGURES, key=lambda k: getattr(third, k) / max(getattr(exp, k), 1e-12))
        goals[kind] = {
            "third_worst_figure_over_exp": round(getattr(third, worst) / max(getattr(exp, worst), 1e-12), 3),
            "same_count_prefill_tokens_over_exp": round(same.prefill_tokens / max(exp.prefill_tokens, 1e-12), 3),
            "unfitted": third.unfitted + same.unfitted,
        }
        print(
            f"{kind:12s} {exp.prefill_tokens:10.1%} {goals[kind]['third_worst_figure_over_exp']:20.3f} ({worst[:13]})"
            f" {goals[kind]['same_count_prefill_tokens_over_exp']:13.3f}"
        )
    return goals


_FIGURES = ("prefill_tokens", "prefill_ctx", "decode_batch", "decode_blocks")


def _chart(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    traffic = [(f.total, f.prefill_tokens) for n, f in results.items() if n.startswith("traffic")]
    ax.plot([t for t, _ in traffic], [100 * w for _, w in traffic], "o-", label="traffic (fitted, several budgets)")
    for name, marker in (("exponential", "s"), ("linear", "^"), ("pad", "D")):
        f = results[name]
        ax.plot([f.total], [100 * f.prefill_tokens], marker, markersize=9, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("buckets (prompt + decode), log scale")
    ax.set_ylabel("prefill token waste, % of padded tokens")
    ax.set_title("llama3-8b limits: fit on 1st half of Azure conv trace, evaluate on 2nd")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
