"""The `prebake` command: list, fetch, serve, verify and manage bundles.

Exit codes: 0 success, 2 bad input (unknown model, malformed recipe, bad registry
address), 3 a miss (`fetch` found no matching bundle; the nearest one is explained);
`verify` and `store verify` exit 1 when they found bad entries, `store rm` when it kept a
bundle a live engine holds. Every command that prints a report takes --json.

Each command group lives in its own module with an `add(subparsers)` function; this
module only assembles them and maps prebake's errors to exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from artifacts.errors import ExitCode, PrebakeError
from engine import logs
from engine.cli import bake, buckets, bundles, plan, serving, stats, store

COMMAND_GROUPS = (bundles, serving, store, stats, buckets, plan, bake)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        logs.configure()
        return args.run(args)
    except (PrebakeError, logs.LogSettingError) as exc:
        print(f"prebake: error: {exc}", file=sys.stderr)
        return ExitCode.INVALID


def build_parser() -> argparse.ArgumentParser:
    """The whole `prebake` command line (docs/gen_reference.py walks it for docs/reference/cli.md)."""
    parser = argparse.ArgumentParser(prog="prebake", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"prebake {_version()}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prebake")
    except PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
