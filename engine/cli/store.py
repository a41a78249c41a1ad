"""Local store commands: gc."""

from __future__ import annotations

import argparse

from artifacts.store import Store


def add(sub) -> None:
    gc = sub.add_parser("gc", help="evict least recently used bundles from the local store; never one in use")
    gc.add_argument(
        "--max-size", help="how large the store may be, e.g. 10G or 500M (default: $PREBAKE_STORE_MAX_BYTES)"
    )
    gc.set_defaults(run=cmd_gc)


def cmd_gc(args: argparse.Namespace) -> int:
    from artifacts.errors import StoreError
    from artifacts.store import parse_size

    store = Store()
    bound = parse_size(args.max_size, "--max-size") if args.max_size else store.limits.max_bytes
    if bound is None:
        raise StoreError("say how large the store may be: prebake gc --max-size 10G, or set PREBAKE_STORE_MAX_BYTES")
    print(store.gc(bound).render())
    return 0
