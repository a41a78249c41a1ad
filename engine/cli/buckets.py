"""`prebake buckets`: compare bucket strategies on replayed traffic, and fit a traffic set.

    prebake buckets --model llama3-8b --trace fit.csv --evaluate eval.jsonl --budget 40 --json

For each strategy asked (default: all) it prints the bucket counts and the padding of the
simulated EVAL traffic (default: the FIT trace). Without any trace it shows the rule-based sets
(exponential, linear, pad) for the recipe's limits and their counts, and one strategy's buckets. `--out` writes the fitted set (traffic, else the
first strategy) as the buckets artifact's buckets.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prebake.artifacts.buckets.replay import ReplaySettings, replay
from prebake.artifacts.buckets.report import STRATEGY_ORDER, figures, strategy_set
from prebake.artifacts.buckets.traces import read_trace
from prebake.artifacts.errors import BucketError, ExitCode
from prebake.artifacts.fsutil import atomic_target
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.cli.common import command, json_option


def add(sub) -> None:
    p = command(
        sub,
        "buckets",
        group="bake and plan",
        help="show a recipe's bucket sets; compare strategies on a trace; fit a traffic-aware set",
        examples=[
            "prebake buckets --model llama3-8b",
            "prebake buckets --model llama3-8b --strategy pad --json",
            "prebake buckets --model llama3-8b --trace fit.csv --evaluate eval.jsonl --budget 40",
        ],
    )
    p.add_argument("--model", required=True, help="recipe name or path: its [serving] limits are used")
    p.add_argument("--strategy", action="append", choices=STRATEGY_ORDER, help="repeatable (default: all)")
    p.add_argument(
        "--trace", type=Path, help="trace to fit on, .csv (Azure) or .jsonl (default: the recipe's, else none)"
    )
    p.add_argument("--evaluate", type=Path, help="trace to report on (default: the fit trace)")
    p.add_argument(
        "--budget", type=int, help="traffic: most buckets in all (default: recipe's, else exponential's / 3)"
    )
    p.add_argument("--rate", type=float, help="replay at this many requests per second (default: trace timestamps)")
    p.add_argument("--out", type=Path, help="write the fitted set here as buckets.json")
    json_option(p, "one object: strategy -> counts (and waste, with a trace)")
    p.set_defaults(run=cmd_buckets)


def cmd_buckets(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.model)
    limits, settings = recipe.serving, recipe.buckets
    if args.budget is not None and args.budget < 1:
        raise BucketError(f"--budget {args.budget} must be a positive number of buckets")
    fit_path = args.trace or (Path(settings.trace) if settings.trace else None)
    if fit_path is None and args.evaluate is None:
        return _without_traffic(args, recipe.model.name, limits)
    replaying = ReplaySettings(rate=args.rate if args.rate is not None else settings.rate)
    eval_shapes = replay(read_trace(args.evaluate), limits, replaying) if args.evaluate is not None else None
    fit_shapes = replay(read_trace(fit_path), limits, replaying) if fit_path is not None else None
    strategies = args.strategy or [s for s in STRATEGY_ORDER if s != "traffic" or fit_shapes is not None]
    if "traffic" in strategies and fit_shapes is None:
        raise BucketError(_TRAFFIC_NEEDS_TRACE.format(name=recipe.model.name))
    eval_shapes = eval_shapes if eval_shapes is not None else fit_shapes
    assert eval_shapes is not None  # a fit trace or an evaluation trace was given
    budget = args.budget if args.budget is not None else settings.budget
    max_waste = settings.max_waste if args.budget is None else None
    sets = {s: strategy_set(s, limits, fit_shapes, budget=budget, max_waste=max_waste) for s in strategies}
    report = {s: figures(b, eval_shapes) for s, b in sets.items()}
    if args.out is not None:
        _write(args.out, sets.get("traffic") or next(iter(sets.values())))
    if args.json:
        print(json.dumps({s: f.to_json() for s, f in report.items()}))
        return ExitCode.OK
    print(
        f"{'strategy':12s} {'prompt':>7s} {'decode':>7s} {'pf_tok':>7s} {'pf_ctx':>7s} {'dc_bat':>7s} {'dc_blk':>7s} unfitted"
    )
    for s, f in report.items():
        print(
            f"{s:12s} {f.prompt:7d} {f.decode:7d} {f.prefill_tokens:7.1%} {f.prefill_ctx:7.1%} "
            f"{f.decode_batch:7.1%} {f.decode_blocks:7.1%} {f.unfitted}"
        )
    if args.out is not None:
        print(f"wrote {args.out}")
    return ExitCode.OK


_TRAFFIC_NEEDS_TRACE = (
    "the traffic strategy fits a set on traffic: pass --trace FILE (.csv or .jsonl; recipe {name} names none), "
    "or pick exponential, linear or pad"
)


def _without_traffic(args: argparse.Namespace, name: str, limits) -> int:
    """No trace: each rule-based set for these limits, its counts and (for one strategy) its buckets.
    Padding waste needs traffic to measure, so it is left out and the way to get it is named."""
    strategies = args.strategy or [s for s in STRATEGY_ORDER if s != "traffic"]
    if "traffic" in strategies:
        raise BucketError(_TRAFFIC_NEEDS_TRACE.format(name=name))
    sets = {s: strategy_set(s, limits, None) for s in strategies}
    if args.out is not None:
        _write(args.out, next(iter(sets.values())))
    if args.json:
        payload = {
            s: {"prompt": len(b.prompt), "decode": len(b.decode), "waste": None, "unfitted": None}
            | ({"buckets": b.to_json()} if len(sets) == 1 else {})
            for s, b in sets.items()
        }
        print(json.dumps(payload))
        return ExitCode.OK
    print(f"{'strategy':12s} {'prompt':>7s} {'decode':>7s} {'total':>7s}")
    for s, b in sets.items():
        print(f"{s:12s} {len(b.prompt):7d} {len(b.decode):7d} {len(b.prompt) + len(b.decode):7d}")
    if len(sets) == 1:
        (only,) = sets.values()
        for phase, buckets in (("prompt", only.prompt), ("decode", only.decode)):
            shown = " ".join(f"({b.batch},{b.query},{b.ctx_blocks})" for b in buckets)
            print(f"{phase} buckets (batch, query, ctx_blocks): {shown}")
    else:
        print("--strategy NAME shows that set's buckets")
    print(f"padding waste and the traffic strategy need traffic: pass --trace FILE (recipe {name} names none)")
    if args.out is not None:
        print(f"wrote {args.out}")
    return ExitCode.OK


def _write(path: Path, chosen) -> None:
    with atomic_target(path) as tmp:
        tmp.write_text(json.dumps(chosen.to_json(), indent=1, sort_keys=True))
