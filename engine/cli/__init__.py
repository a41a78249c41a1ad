"""The `prebake` command: bake and plan, registries, the local store, serving, keys and fleets.

Exit codes (engine/cli/outcome.py, docs/commands.md): 0 done; 1 checked and found bad (verify),
or a bake failed; 2 bad input or refused content; 3 nothing matches (a miss); 4 the registry could
not be asked (down, refusing us, out of time); 5 the local store ($PREBAKE_HOME) cannot be used.
Every command that prints a report takes --json, and with --json a failure prints a JSON error
object. Nothing a registry or network sends ends in a traceback.

Each command group lives in its own module with an `add(subparsers)` function that declares its
commands with common.command (group, examples, store use); registering a module is one line in
COMMAND_MODULES.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import select
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from prebake.artifacts.errors import ExitCode
from prebake.engine.common import cores, logs

if TYPE_CHECKING:  # the command modules (and the adapters they import) are imported when the parser is built
    from prebake.engine.cli.common import ListedCommand

# Each command group's module (engine/cli/NAME.py), imported when the parser is built: `prebake
# serve` and `prebake fetch` build theirs alone (FAST_COMMANDS), so a start imports none of the bake's,
# the registry admin's or the fleet's modules (docs/snapshots.md: a restore's floor is its imports).
COMMAND_MODULES = (
    "bake",
    "plan",
    "buckets",
    "recipes",
    "bundles",
    "copy",
    "kernel_cache",
    "store",
    "stats",
    "serving",
    "doctor",
    "keys",
    "revoke",
    "promote",
)
FAST_COMMANDS = {"serve": "serving", "fetch": "serving"}  # a command -> the one module its parser needs


def entry() -> None:
    """The `prebake` console script: `main`, then the exit (timebox.leave: a registry's abandoned read
    or torch's import still running does not turn the exit code into SIGABRT)."""
    from prebake.artifacts.timebox import leave

    leave(main())


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if argv is None and _command(words) == "serve":  # the start's probe of its cores, beside the imports below
        cores.begin(os.environ)
    with _collector_paused(argv is None):
        parser = build_parser(json_errors="--json" in words or "json" in words, only=_fast_module(words))
        args = parser.parse_args(words)
    from prebake.engine.cli.common import warn_deprecated

    try:
        logs.configure(_log_environment(args.verbosity))
        warn_deprecated(args)
        _check_store(args)
        return args.run(args)
    except BrokenPipeError as exc:
        if not _reader_gone(sys.stdout):  # another pipe or socket broke: a failure, not `| head`
            exc.add_note(
                "not prebake's output: a pipe to a process it started or a peer broke (a bug: please report it)"
            )
            return _failed(exc, args)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return ExitCode.OK  # `prebake ls | head`: the reader has all it wanted
    except Exception as exc:  # the exit-code table holds even for a fault nobody foresaw
        return _failed(exc, args)


@contextmanager
def _collector_paused(process: bool) -> Iterator[None]:
    """The parser's build, in a `prebake` process (`process`: not a caller's main([...])), without
    Python's cyclic garbage collector: it imports the command's modules (pydantic's models, the
    adapters), whose objects live as long as the process. They are frozen after (gc.freeze: no later
    pass scans them) and the collector runs again, as it was, before the command does. Its passes
    over them were 15 ms of `prebake serve`'s 0.22 s before a snapshot restore, 4 ms now; re-enabled
    unfrozen, the first passes over everything cost 30 ms (docs/snapshots.md, "The supervisor's
    imports"). About 500 objects of import-time garbage stay, once."""
    enabled = process and gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()


def _failed(exc: Exception, args: argparse.Namespace) -> int:
    from prebake.engine.cli.outcome import failure

    failed = failure(exc)
    print(f"prebake: error: {failed.message}", file=sys.stderr)
    if _wants_json(args):
        print(failed.to_json())
    return failed.code


def _reader_gone(stream: object) -> bool:
    """Whether `stream` is a pipe whose reader closed it (poll(2) reports POLLERR on its write end).
    A BrokenPipeError from any other pipe (a restore's control pipe, a child's stdin) once ended a
    start with exit 0 and no word (docs/snapshots.md, "Stops that waited, or said nothing")."""
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)  # type: ignore[attr-defined]
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


class Parser(argparse.ArgumentParser):
    """argparse's parser; a usage error of a command asked for --json also prints a JSON error object.
    `listed`: the commands its help lists, in order (what build_parser added: a later build, a
    start's included, makes its own list and leaves this one as it was)."""

    json_errors = False
    listed: tuple[ListedCommand, ...] = ()

    def error(self, message: str):  # type: ignore[override]
        if self.json_errors:
            from prebake.engine.cli.outcome import Failure

            print(Failure(ExitCode.INVALID, "UsageError", f"{self.prog}: {message}").to_json())
        super().error(message)


def build_parser(*, json_errors: bool = False, only: str | None = None) -> Parser:
    """The whole `prebake` command line (docs/gen_reference.py walks it for docs/reference/cli.md);
    `only`: the commands of that one module (a start's parser: its flags are the same)."""
    from prebake import __version__
    from prebake.engine.cli.common import LISTED, Formatter, verbosity_options

    LISTED.clear()
    Parser.json_errors = json_errors
    parser = Parser(
        prog="prebake",
        usage="prebake [-h] [--version] [-v | -q] COMMAND ...",
        description=__doc__.splitlines()[0],
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"prebake {__version__}")
    verbosity_options(parser)
    sub = parser.add_subparsers(required=True, metavar="COMMAND", prog="prebake", help=argparse.SUPPRESS)
    for name in (only,) if only else COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").add(sub)
    parser.listed = tuple(LISTED)
    parser.epilog = _grouped(parser.listed)
    return parser


def _fast_module(words: Sequence[str]) -> str | None:
    """The one command module a start's parser needs."""
    command = _command(words)
    return FAST_COMMANDS.get(command) if command is not None else None


def _command(words: Sequence[str]) -> str | None:
    return next((w for w in words if not w.startswith("-")), None)  # the first word that is no option


def _grouped(listed: Sequence[ListedCommand]) -> str:
    from prebake.engine.cli.common import GROUPS

    width = max(len(c.name) for c in listed)
    lines = []
    for group in [*GROUPS, *sorted({c.group for c in listed} - set(GROUPS))]:
        members = [c for c in listed if c.group == group]
        if members:
            lines.append(f"{group}:")
            lines += [f"  {c.name:<{width}}  {c.help}" for c in members]
    lines.append("\n`prebake COMMAND --help` shows a command's options, defaults and examples.")
    return "\n".join(lines)


def _log_environment(verbosity: int) -> dict[str, str] | None:
    if not verbosity:
        return None
    return {**os.environ, logs.LEVEL_VARIABLE: "DEBUG" if verbosity > 0 else "WARNING"}


def _check_store(args: argparse.Namespace) -> None:
    from prebake.artifacts.store.home import check_home
    from prebake.artifacts.store.settings import default_home

    use = args.store_use(args) if callable(args.store_use) else args.store_use
    if use is not None:  # "serve": writes where it can, reads a read-only store (serve, fetch)
        check_home(default_home(), write=use in ("write", "serve"), read_only_ok=use == "serve")


def _wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False)) or getattr(args, "format", None) == "json"


if __name__ == "__main__":
    sys.exit(main())
