"""Options and tables the commands share, and `command`: how every command is declared.

    p = command(sub, "ls", group="registry", help="...", examples=["prebake ls --kind graphs"], store="read")

registers one command in one line: its group in `prebake --help`, its examples, whether it reads
or writes the local store (checked before it runs: artifacts/store/home.py), and -v/-q. A
`deprecated=` command is a hidden alias that still works and says where the action lives now.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prebake.engine import adapters
from prebake.engine.common.adapter import EngineOption
from prebake.registry.address import join_addresses, split_addresses
from prebake.registry.schemes import address_forms

GROUPS = ("bake and plan", "registry", "store", "serve", "keys", "fleet")  # the order of `prebake --help`


@dataclass(frozen=True)
class ListedCommand:
    """One command as `prebake --help` lists it."""

    group: str
    name: str
    help: str


LISTED: list[ListedCommand] = []  # filled as the command modules add their commands
StoreUse = str | Callable[[argparse.Namespace], str | None] | None  # "read", "write", "serve", or None (no store)


def writes_with(flag: str) -> Callable[[argparse.Namespace], str]:
    """The store use of a command that writes only with `flag` set (verify --fix, stats --zero)."""
    return lambda args: "write" if getattr(args, flag) else "read"


def reads_with(flag: str) -> Callable[[argparse.Namespace], str]:
    """The store use of a command that only reads with `flag` set (gc --dry-run, rm --dry-run)."""
    return lambda args: "read" if getattr(args, flag) else "write"


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; every option that takes a value shows its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.option_strings
            and action.nargs != 0
            and not action.required
            and action.default is not argparse.SUPPRESS
            and "default" not in text
        ):
            shown = "none" if action.default in (None, [], ()) else action.default
            text = f"{text} (default: {shown})".strip()
        return text


def command(
    sub,
    name: str,
    *,
    group: str,
    help: str,
    description: str | None = None,
    examples: Sequence[str] = (),
    store: StoreUse = None,
    deprecated: str | None = None,
    aliases: Sequence[str] = (),
    listed_as: str | None = None,
) -> argparse.ArgumentParser:
    """Add one command: listed under `group` in `prebake --help` (unless `deprecated`, then hidden)."""
    epilog = ("examples:\n" + "\n".join(f"  {e}" for e in examples)) if examples else None
    parser = sub.add_parser(
        name,
        help=help,
        description=description or (help[0].upper() + help[1:] + "."),
        epilog=epilog,
        formatter_class=Formatter,
        aliases=list(aliases),
    )
    verbosity_options(parser, default=argparse.SUPPRESS)
    parser.set_defaults(store_use=store, deprecated=deprecated, spelled=f"{sub._prog_prefix} {name}")
    if deprecated is None:
        LISTED.append(ListedCommand(group, listed_as or name, help))
    return parser


def verbosity_options(parser: argparse.ArgumentParser, *, default=0) -> None:
    """-v / -q: more or fewer log lines (PREBAKE_LOG_LEVEL DEBUG / WARNING), before or after the command."""
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument(
        "-v", "--verbose", dest="verbosity", action="store_const", const=1, default=default, help="log more (DEBUG)"
    )
    loud.add_argument(
        "-q",
        "--quiet",
        dest="verbosity",
        action="store_const",
        const=-1,
        default=default,
        help="log only warnings and errors",
    )


def warn_deprecated(args: argparse.Namespace) -> None:
    if getattr(args, "deprecated", None):
        print(
            f"prebake: `{args.spelled}` is now `{args.deprecated}`; the old spelling still works for now",
            file=sys.stderr,
        )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="recipe name (as `prebake recipes` lists them) or path")
    parser.add_argument("--precision", help="dtype to serve (default: the recipe's first buildable one)")
    parser.add_argument("--tp", type=positive_int, help="tensor-parallel size (default: the smallest baked)")


class _AddressList(argparse.Action):
    """--registry, repeatable: each flag adds its address (or comma list) to the chain, nearest first.
    The members are kept escaped (registry/address.py), so a folder named with a comma stays one."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = split_addresses(getattr(namespace, self.dest) or "") if getattr(namespace, self.dest) else []
        setattr(namespace, self.dest, join_addresses([*before, *split_addresses(str(values))]))


def registry_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry",
        action=_AddressList,
        help=f"registry address: {address_forms()}; repeat the flag for a chain, "
        "nearest first (a comma list works too; write a comma in a folder's name as \\,) "
        "(default: $PREBAKE_REGISTRY, else $PREBAKE_HOME/registry)",
    )


def engine_options(parser: argparse.ArgumentParser, command: str) -> None:
    """--engine, --mounted, and every registered engine's start options that `command` takes
    (adapters.start_options: each declared once, in its engine's EngineSpec)."""
    parser.add_argument(
        "--engine",
        choices=sorted(adapters.ADAPTERS),  # read when the parser is built
        default="prebake",
        help="the engine to serve with: prebake's own (default) or vLLM (recipes with engine = 'vllm')",
    )
    parser.add_argument(
        "--mounted",
        action="append",
        default=[],
        metavar="KIND=PATH",
        help="a bundle tree already mounted read-only (an image volume), e.g. graphs=/bundles/graphs: "
        "checked file by file against its key's signed manifest from the registry, then used in place",
    )
    for engine, option in adapters.start_options(command):
        _start_option(parser, engine, option)


def _start_option(parser: argparse.ArgumentParser, engine: str, option: EngineOption) -> None:
    text = option.help if engine == "prebake" else f"with --engine {engine}: {option.help}"  # prebake: the default
    if option.type is tuple:  # the arguments after --, as they are
        parser.add_argument(option.name, nargs="*", metavar=f"-- {engine.upper()}_ARGS", help=text)
    elif option.type is bool:
        parser.add_argument(option.flag, action="store_true", help=text)
    else:
        parser.add_argument(option.flag, type=option.type, help=text)


def json_option(parser: argparse.ArgumentParser, what: str = "the report") -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as JSON (a stable shape, see docs/operations.md); on failure, a JSON error object",
    )
