"""`prebake buckets`: compare bucket strategies on replayed traffic, and fit a traffic set.

    prebake buckets --model llama3-8b --trace fit.csv --evaluate eval.jsonl --budget 40 --json

For each strategy asked (default: all) it prints the bucket counts and the padding of the
simulated EVAL traffic (default: the FIT trace). Without any trace it shows the rule-based sets
(exponential, linear, pad) for the recipe's limits and their counts, and one strategy's buckets. `--out` writes the fitted set (traffic, else the
first strategy) as the buckets artifact's buckets.json. The comparison itself is
artifacts/buckets/compare.py's; this module parses the flags and prints it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prebake.artifacts.buckets.compare import Asked, compare, write_set
from prebake.artifacts.buckets.report import STRATEGY_ORDER
from prebake.artifacts.errors import ExitCode
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
    asked = Asked(tuple(args.strategy or ()), args.trace, args.evaluate, args.budget, args.rate)
    comparison = compare(recipe.serving, recipe.buckets, asked, name=recipe.model.name)
    if args.out is not None:
        write_set(args.out, comparison.chosen())
    if args.json:
        print(json.dumps(comparison.to_json()))
        return ExitCode.OK
    print(comparison.render())
    if args.out is not None:
        print(f"wrote {args.out}")
    return ExitCode.OK
