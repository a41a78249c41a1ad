"""`prebake buckets`: compare bucket strategies on replayed traffic, and fit a traffic set.

    prebake buckets --model llama3-8b --trace fit.csv --evaluate eval.jsonl --budget 40 --json

For each strategy asked (default: all) it prints the bucket counts and the padding of the
simulated EVAL traffic (default: the FIT trace). `--out` writes the fitted set (traffic, else the
first strategy) as the buckets artifact's buckets.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prebake.artifacts.bake.recipes import load_recipe
from prebake.artifacts.buckets.replay import ReplaySettings, replay
from prebake.artifacts.buckets.report import STRATEGY_ORDER, figures, strategy_set
from prebake.artifacts.buckets.traces import read_trace
from prebake.artifacts.errors import BucketError, ExitCode
from prebake.artifacts.fsutil import atomic_target


def add(sub) -> None:
    p = sub.add_parser("buckets", help="compare bucket strategies on a trace; fit a traffic-aware bucket set")
    p.add_argument("--model", required=True, help="recipe name or path: its [serving] limits are used")
    p.add_argument("--strategy", action="append", choices=STRATEGY_ORDER, help="repeatable (default: all)")
    p.add_argument("--trace", type=Path, help="trace to fit on, .csv (Azure) or .jsonl (default: the recipe's)")
    p.add_argument("--evaluate", type=Path, help="trace to report on (default: the fit trace)")
    p.add_argument(
        "--budget", type=int, help="traffic: most buckets in all (default: recipe's, else exponential's / 3)"
    )
    p.add_argument("--rate", type=float, help="replay at this many requests per second (default: trace timestamps)")
    p.add_argument("--out", type=Path, help="write the fitted set here as buckets.json")
    p.add_argument("--json", action="store_true", help="print one JSON object: strategy -> counts and waste")
    p.set_defaults(run=cmd_buckets)


def cmd_buckets(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.model)
    limits, settings = recipe.serving, recipe.buckets
    fit_path = args.trace or (Path(settings.trace) if settings.trace else None)
    if fit_path is None:
        raise BucketError(f"no trace to replay: pass --trace FILE (recipe {recipe.model.name} names none)")
    if args.budget is not None and args.budget < 1:
        raise BucketError(f"--budget {args.budget} must be a positive number of buckets")
    replaying = ReplaySettings(rate=args.rate if args.rate is not None else settings.rate)
    fit_shapes = replay(read_trace(fit_path), limits, replaying)
    eval_shapes = fit_shapes if args.evaluate is None else replay(read_trace(args.evaluate), limits, replaying)
    budget = args.budget if args.budget is not None else settings.budget
    max_waste = settings.max_waste if args.budget is None else None
    sets = {
        s: strategy_set(s, limits, fit_shapes, budget=budget, max_waste=max_waste)
        for s in (args.strategy or STRATEGY_ORDER)
    }
    report = {s: figures(b, eval_shapes) for s, b in sets.items()}
    if args.out is not None:
        chosen = sets.get("traffic") or next(iter(sets.values()))
        with atomic_target(args.out) as tmp:
            tmp.write_text(json.dumps(chosen.to_json(), indent=1, sort_keys=True))
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
