"""The `prebake` command: list, fetch, serve, verify and manage bundles.

Exit codes: 0 success, 2 bad input (unknown model, malformed recipe, bad registry
address), 3 a miss (`fetch` found no matching bundle; the nearest one is explained);
`verify` exits 1 when it found bad entries.

Each command group lives in its own module with an `add(subparsers)` function; this
module only assembles them and maps prebake's errors to exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from artifacts.errors import ExitCode, PrebakeError
from engine import logs
from engine.cli import bundles, serving, store

COMMAND_GROUPS = (bundles, serving, store)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        logs.configure()
        return args.run(args)
    except (PrebakeError, logs.LogSettingError) as exc:
        print(f"prebake: error: {exc}", file=sys.stderr)
        return ExitCode.INVALID


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prebake", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add(sub)
    return parser


if __name__ == "__main__":
    sys.exit(main())
