"""Options and tables the commands share."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from prebake.artifacts.fsutil import human_size
from prebake.engine import adapters


def target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="recipe name (recipes/<name>.toml) or path")
    parser.add_argument("--precision", help="dtype to serve (default: the recipe's first buildable one)")
    parser.add_argument("--tp", type=int, help="tensor-parallel size (default: the smallest baked)")


def registry_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry",
        help="registry address: a folder, file://, s3://bucket/prefix, hf://ns/repo, or a comma list "
        "(default: $PREBAKE_REGISTRY, else $PREBAKE_HOME/registry)",
    )


def engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=sorted({adapter.name for adapter in adapters.ADAPTERS}),  # read when the parser is built
        default="prebake",
        help="the engine to serve with: prebake's own (default) or vLLM (recipes with engine = 'vllm')",
    )
    parser.add_argument(
        "--cache-root",
        type=Path,
        help="with --engine vllm: a local folder for this vLLM's writable cache copy "
        "(default: a fresh one under $PREBAKE_HOME/engines/vllm)",
    )


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the report as JSON (a stable shape, see docs/operations.md)"
    )


size = human_size  # the one formatter (prebake.artifacts.fsutil.human_size)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r).rstrip() for r in [headers, *rows])
