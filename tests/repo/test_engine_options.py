"""An engine's start options are declared once, in its EngineSpec: the CLI builds every flag of
them (engine/cli/common.py engine_options) and adds none of them by hand, and `prebake fetch|serve
--help` documents each."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from prebake.engine.adapters import ADAPTERS, start_options
from prebake.engine.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def _hand_written_flags() -> dict[str, str]:
    """Every flag string an `add_argument` call of the CLI's modules names, with where."""
    found = {}
    for path in sorted((REPO / "engine" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        found[arg.value] = f"{path.relative_to(REPO)}:{node.lineno}"
    return found


def test_no_engine_option_is_a_flag_written_by_hand_in_the_cli():
    declared = {option.flag for adapter in ADAPTERS.values() for option in adapter.spec.options}
    by_hand = _hand_written_flags()
    assert not [f"{flag} ({by_hand[flag]})" for flag in declared if flag in by_hand]


def test_every_declared_option_is_documented_by_the_commands_that_take_it(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    parser = build_parser()
    for command in ("fetch", "serve"):
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        text = subparsers.choices[command].format_help()
        for engine, option in start_options(command):
            label = f"-- {engine.upper()}_ARGS" if option.flag == "--" else option.flag
            assert label in text and option.help in text, (command, option.flag)
