"""`prebake store stats` (and its old spelling `prebake stats`): how often this node's fetches and start-ups hit, why they missed, what it saved."""

from __future__ import annotations

import argparse
import json

from prebake.artifacts.errors import ExitCode
from prebake.artifacts.store.stats.ledger import read_stats
from prebake.engine.cli.common import command, json_option, writes_with
from prebake.engine.compose import open_store


def add(sub) -> None:
    stats_options(
        command(
            sub,
            "stats",
            group="store",
            help="hit rate per kind, miss reasons, seconds saved; the store's size and bound",
            deprecated="prebake store stats",
            store=writes_with("zero"),
        )
    )


def stats_options(stats: argparse.ArgumentParser) -> None:
    stats.add_argument("--zero", action="store_true", help="print the counts, then start counting again from zero")
    json_option(stats)
    stats.set_defaults(run=cmd_stats)


def cmd_stats(args: argparse.Namespace) -> int:
    report = read_stats(open_store(), zero=args.zero)
    print(json.dumps(report.to_json(), indent=2, sort_keys=True) if args.json else report.render())
    return ExitCode.OK
