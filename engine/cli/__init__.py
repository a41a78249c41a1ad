"""The `prebake` command: list, fetch, serve, verify and manage bundles.

Exit codes: 0 success (installed), 2 refused or invalid (unknown model, malformed recipe,
bad registry address, a bundle or index entry that fails a check, a registry fault), 3 a
miss (`fetch` found no matching bundle; the nearest one is explained); `verify` exits 1
when it found bad entries. Nothing a registry or network sends ends in a traceback: an
error prebake did not foresee is still reported in one line, with exit code 2.

Each command group lives in its own module with an `add(subparsers)` function; this
module only assembles them and maps prebake's errors to exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from artifacts.errors import ExitCode, PrebakeError
from engine.cli import bundles, serving, store

COMMAND_GROUPS = (bundles, serving, store)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except PrebakeError as exc:
        print(f"prebake: error: {exc}", file=sys.stderr)
        return ExitCode.INVALID
    except OSError as exc:  # the local disk or network, outside prebake's own checks
        print(f"prebake: error: {exc}", file=sys.stderr)
        return ExitCode.INVALID
    except Exception as exc:  # the 0/2/3 contract holds even for a fault nobody foresaw
        print(
            f"prebake: error: unexpected {type(exc).__name__}: {exc} (a bug in prebake: please report it)",
            file=sys.stderr,
        )
        return ExitCode.INVALID


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prebake", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add(sub)
    return parser


if __name__ == "__main__":
    sys.exit(main())
