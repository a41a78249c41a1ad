"""The `prebake` command: list, fetch, serve, verify and manage bundles.

Exit codes: 0 success (installed), 2 refused or invalid (unknown model, malformed recipe,
bad registry address, a bundle or index entry that fails a check), 3 a miss (`fetch` found no
usable bundle, or the registry did not answer: the nearest bundle or the fault is explained);
`verify` and `store verify` exit 1 when they found bad entries, `store rm` when it kept a
bundle a live engine holds. Every command that prints a report takes --json. Nothing a
registry or network sends ends in a traceback: an error prebake did not foresee is still
reported in one line, with exit code 2.

Each command group lives in its own module with an `add(subparsers)` function; this
module only assembles them and maps prebake's errors to exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from prebake import __version__
from prebake.artifacts.errors import ExitCode, PrebakeError
from prebake.engine.cli import bake, buckets, bundles, plan, serving, stats, store
from prebake.engine.common import logs

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
    except OSError as exc:  # the local disk or network, outside prebake's own checks
        print(f"prebake: error: {exc}", file=sys.stderr)
        return ExitCode.INVALID
    except Exception as exc:  # the 0/2/3 contract holds even for a fault nobody foresaw
        print(
            f"prebake: error: unexpected {type(exc).__name__}: {exc} (a bug in prebake: please report it)",
            file=sys.stderr,
        )
        return ExitCode.INVALID


def build_parser() -> argparse.ArgumentParser:
    """The whole `prebake` command line (docs/gen_reference.py walks it for docs/reference/cli.md)."""
    parser = argparse.ArgumentParser(prog="prebake", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"prebake {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add(sub)
    return parser


if __name__ == "__main__":
    sys.exit(main())
