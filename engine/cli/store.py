"""Local store commands: store ls | verify | rm | gc | stats (what is installed, whether it is whole,
how large it may grow). `prebake gc` and `prebake stats` are the old spellings, kept as hidden aliases.

Every report takes --json; the shapes are documented in docs/operations.md and kept stable.
"""

from __future__ import annotations

import argparse
import json

from prebake.artifacts.errors import ExitCode
from prebake.artifacts.fsutil import human_size
from prebake.artifacts.store import admin as store_admin
from prebake.artifacts.store.inventory import inventory
from prebake.artifacts.store.settings import DEFAULT_MAX_BYTES, parse_size
from prebake.engine.adapters import kind_names
from prebake.engine.cli.common import (
    Formatter,
    StoreUse,
    command,
    json_option,
    reads_with,
    writes_with,
)
from prebake.engine.compose import address_in_force, gc_trust, open_store


def add(sub) -> None:
    gc_options(
        command(
            sub,
            "gc",
            group="store",
            help="evict least recently used bundles from the local store",
            deprecated="prebake store gc",
            store=reads_with("dry_run"),
        )
    )
    store = sub.add_parser(
        "store",
        help="the local store: ls, verify, rm, gc, stats",
        description="The local store ($PREBAKE_HOME): what is installed, whether it is whole, its size and bound.",
        formatter_class=Formatter,
    )
    cmds = store.add_subparsers(required=True, metavar="STORE_COMMAND")
    ls = _store_command(
        cmds,
        "ls",
        "list the installed bundles: size, last use, held by a live engine or not",
        ["prebake store ls", "prebake store ls --json"],
        "read",
    )
    json_option(ls)
    ls.set_defaults(run=cmd_store_ls)

    verify = _store_command(
        cmds,
        "verify",
        "re-hash every installed tree and blob against its manifest",
        ["prebake store verify", "prebake store verify --fix"],
        writes_with("fix"),
    )
    verify.add_argument(
        "--fix",
        action="store_true",
        help="remove broken bundles (never one held by a live engine) so the next fetch installs them again",
    )
    json_option(verify)
    verify.set_defaults(run=cmd_store_verify)

    rm = _store_command(
        cmds,
        "rm",
        "remove bundles from the store (never one held by a live engine)",
        ["prebake store rm tiny-llama --kind graphs --dry-run"],
        reads_with("dry_run"),
    )
    rm.add_argument("selector", help="a model name (all its bundles), or a key or blob digest prefix (4+ hex digits)")
    rm.add_argument("--kind", choices=kind_names(), help="only bundles of this artifact kind (default: every kind)")
    rm.add_argument("--dry-run", action="store_true", help="remove nothing; show what would go")
    json_option(rm)
    rm.set_defaults(run=cmd_store_rm)

    gc_options(
        _store_command(
            cmds,
            "gc",
            "evict least recently used bundles down to the store's bound; never one in use",
            ["prebake store gc --dry-run", "prebake store gc --max-size 20G"],
            reads_with("dry_run"),
        )
    )
    from prebake.engine.cli.stats import stats_options

    stats_options(
        _store_command(
            cmds,
            "stats",
            "hit rate per kind, the commonest miss reasons, seconds saved; the store's size and bound",
            ["prebake store stats", "prebake store stats --json"],
            writes_with("zero"),
        )
    )


def _store_command(cmds, name: str, help: str, examples: list[str], store: StoreUse) -> argparse.ArgumentParser:
    """`prebake store NAME`, listed under the store group of `prebake --help` by that spelling."""
    return command(cmds, name, group="store", listed_as=f"store {name}", help=help, examples=examples, store=store)


def gc_options(gc: argparse.ArgumentParser) -> None:
    gc.add_argument(
        "--max-size",
        help="how large the store may be, e.g. 10G or 500M "
        f"(default: $PREBAKE_STORE_MAX_BYTES, else {human_size(DEFAULT_MAX_BYTES)})",
    )
    gc.add_argument("--dry-run", action="store_true", help="remove nothing; show what would be evicted")
    json_option(gc)
    gc.set_defaults(run=cmd_gc)


def cmd_gc(args: argparse.Namespace) -> int:
    store = open_store()
    bound = parse_size(args.max_size, "--max-size") if args.max_size else store.limits.max_bytes
    if bound is None:  # a Store made with unbounded limits (tools, tests): the documented default
        bound = DEFAULT_MAX_BYTES
    report = store_admin.collect(
        store, bound, registry=address_in_force(store), dry_run=args.dry_run, refuse=gc_trust(store)
    )
    _show(args, report)
    return ExitCode.OK


def cmd_store_ls(args: argparse.Namespace) -> int:
    _show(args, inventory(open_store()))
    return ExitCode.OK


def cmd_store_verify(args: argparse.Namespace) -> int:
    store = open_store()
    report = store_admin.verify_store(store, fix=args.fix, registry=address_in_force(store) if args.fix else None)
    _show(args, report)
    return report.exit_code


def cmd_store_rm(args: argparse.Namespace) -> int:
    store = open_store()
    chosen = store_admin.select(store, args.selector, args.kind)
    report = store_admin.remove(store, chosen, registry=address_in_force(store), dry_run=args.dry_run)
    _show(args, report)
    return ExitCode.FAILED if report.kept else ExitCode.OK


def _show(args: argparse.Namespace, report) -> None:
    """A report as --json asked, or as its text."""
    _print_json(report.to_json()) if args.json else print(report.render())


def _print_json(payload: dict) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))
