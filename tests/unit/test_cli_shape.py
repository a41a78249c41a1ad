"""The shape of `prebake --help`: grouped commands, one home per action, examples, a default for
every option, -v/-q, and --json the same on every report command (with a JSON error on failure)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from prebake.engine.cli import build_parser, main
from prebake.engine.cli.common import GROUPS
from tests.support.baking import REPO


def _leaves(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.update(_leaves(child, f"{prefix} {name}".strip()))
    if not found and prefix:
        found[prefix] = parser
    return found


PARSER = build_parser()
LEAVES = _leaves(PARSER)


def test_the_help_lists_every_command_once_under_its_group_in_order():
    text = PARSER.format_help()
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert [h for h in headings if h in GROUPS] == list(GROUPS)
    listed = [c.name for c in PARSER.listed]  # this parser's own: another test's build makes its own list
    assert len(listed) == len(set(listed))
    hidden = {name for name, p in LEAVES.items() if p.get_default("deprecated")}
    assert set(listed) == set(LEAVES) - hidden


@pytest.mark.parametrize("old, new", [("gc", "store gc"), ("stats", "store stats")])
def test_a_moved_command_is_a_hidden_alias_naming_its_new_home(old, new):
    assert LEAVES[old].get_default("deprecated") == f"prebake {new}"
    assert old not in [c.name for c in PARSER.listed] and new in [c.name for c in PARSER.listed]


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_every_option_that_takes_a_value_shows_its_default(name):
    parser = LEAVES[name]
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.required or action.help == argparse.SUPPRESS:
            continue
        shown = parser._get_formatter()._expand_help(action) if action.help else ""
        assert "default" in parser._get_formatter()._get_help_string(action) or "default" in shown, (
            f"{name} {action.option_strings[0]} shows no default"
        )


MAIN = ("bake", "plan", "buckets", "ls", "verify", "fetch", "serve", "store ls", "store gc", "recipes")


@pytest.mark.parametrize("name", MAIN)
def test_the_main_commands_show_examples(name):
    help_text = LEAVES[name].format_help()
    assert "examples:\n  prebake " in help_text or "examples:\n  eval " in help_text


@pytest.mark.parametrize("flag", ["-v", "-q"])
def test_verbosity_flags_go_before_or_after_the_command(flag):
    assert PARSER.parse_args([flag, "recipes"]).verbosity == PARSER.parse_args(["recipes", flag]).verbosity != 0


# Every command that prints a report, with the fewest words that run it here without a compile.
REPORTS = {
    "ls": ["ls"],
    "verify": ["verify"],
    "preheat": ["preheat", "--mirror", "/no/such/prebake/mirror"],  # not there: a JSON error
    "plan": ["plan", "--model", "tiny-llama"],
    "buckets": ["buckets", "--model", "tiny-llama"],
    "recipes": ["recipes"],
    "fetch": ["fetch", "--model", "tiny-llama", "--precision", "fp32"],
    "store ls": ["store", "ls"],
    "store verify": ["store", "verify"],
    "store rm": ["store", "rm", "tiny-llama", "--dry-run"],
    "store gc": ["store", "gc", "--dry-run"],
    "store stats": ["store", "stats"],
    "gc": ["gc", "--dry-run"],
    "stats": ["stats"],
    "revoke": ["revoke"],  # no signing key: a JSON error
    "promote": ["promote", "--list"],
    "kernel-cache": ["kernel-cache", "--model", "tiny-llama", "--to", "oci://127.0.0.1:9/team/kc:t"],  # a JSON error
    "copy": ["copy", "/no/such/prebake/staging", "/no/such/prebake/production"],  # not there: a JSON error
    "doctor": ["doctor"],  # no CRIU here: a JSON error
}


def test_every_command_with_json_is_in_the_report_table():
    with_json = {name for name, p in LEAVES.items() if any("--json" in a.option_strings for a in p._actions)}
    assert with_json == set(REPORTS)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREBAKE_REGISTRY", raising=False)
    monkeypatch.setenv("PREBAKE_TRUSTED_KEYS", "")
    return tmp_path / "home"


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_json_prints_one_json_document_on_every_report_command(name, home, capsys):
    code = main([*REPORTS[name], "--json"])
    out = capsys.readouterr().out
    data = json.loads(out)  # the whole of stdout is one document
    assert isinstance(data, dict) and (code == 0 or "error" in data or "complete" in data or "bad" in data)


def test_verify_store_json_prints_what_store_verify_json_prints(home, capsys):
    assert main(["store", "verify", "--json"]) == 0
    new = json.loads(capsys.readouterr().out)
    assert main(["verify", "--store", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == new and "is now `prebake store verify`" in captured.err


@pytest.mark.parametrize(
    "argv, code",
    [
        (["fetch", "--model", "no-such-model", "--json"], 2),
        (["plan", "--model", "no-such-model", "--json"], 2),
        (["ls", "--kind", "bogus", "--json"], 2),
        (["store", "rm", "no-such-model", "--json"], 2),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_a_failing_command_with_json_prints_a_json_error_object(argv, code, home, capsys):
    try:
        got = main(argv)
    except SystemExit as exc:  # argparse's own refusals exit from parse_args
        got = exc.code
    assert got == code
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == code and error["message"] and error["type"]


# -- limits a user expects ---------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["ls", "--kind", "bogus"], ["store", "rm", "x", "--kind", "bogus"]], ids=" ".join)
def test_an_unknown_kind_is_refused_naming_the_kinds(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        PARSER.parse_args(argv)
    assert caught.value.code == 2 and "choose from 'buckets', 'autotune', 'graphs'" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_a_clear_error_not_a_bug(port, capsys):
    with pytest.raises(SystemExit) as caught:
        PARSER.parse_args(["serve", "--model", "tiny-llama", "--port", port])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "--port" in err and "bug" not in err


@pytest.mark.parametrize("value", ["0", "-2", "soon"])
def test_a_time_box_that_is_not_a_positive_number_is_refused(value, capsys):
    with pytest.raises(SystemExit):
        PARSER.parse_args(["fetch", "--model", "tiny-llama", "--registry-timeout", value])
    assert "--registry-timeout" in capsys.readouterr().err


def test_an_address_this_machine_does_not_have_names_the_host_not_the_port():
    from prebake.engine.bundled.serve import ListenError, _bind

    with pytest.raises(ListenError) as caught:
        _bind("192.0.2.1", 0)  # TEST-NET-1: on no interface here; binding sends nothing
    message = str(caught.value)
    assert "--host 192.0.2.1 is not an address of this machine" in message and "another --port" not in message


def test_a_port_in_use_still_says_pick_another_port():
    from prebake.engine.bundled.serve import ListenError, _bind

    taken = _bind("127.0.0.1", 0)
    try:
        with pytest.raises(ListenError, match="pick another --port"):
            _bind("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


_BREAKS_A_PIPE = """
import os, sys
import prebake.engine.cli.serving as serving
from prebake.engine.cli import main

def broken(args):
    r, w = os.pipe()
    os.close(r)
    os.write(w, b"settings")  # a pipe whose reader is gone, not the output: a restore's control pipe

serving.cmd_fetch = broken
sys.exit(main(["fetch", "--model", "tiny-llama", "--precision", "fp32"]))
"""


@pytest.mark.parametrize("reader_gone", [False, True])
def test_a_broken_pipe_is_quiet_only_where_the_outputs_reader_left(reader_gone, tmp_path):
    """`prebake ... | head` ends 0 without a word; any other pipe that broke is an error. Before, a
    restore killed before it read its settings ended `prebake serve` with 0 and nothing said."""
    read, write = os.pipe()
    if reader_gone:
        os.close(read)
    env = {**os.environ, "PREBAKE_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-c", _BREAKS_A_PIPE], cwd=REPO, stdout=write, stderr=subprocess.PIPE, env=env, timeout=120
    )
    os.close(write)
    if not reader_gone:
        os.close(read)
    if reader_gone:
        assert done.returncode == 0 and done.stderr == b"", done.stderr.decode()
    else:
        assert done.returncode == 2 and b"Broken pipe" in done.stderr and b"please report it" in done.stderr


@pytest.fixture
def collector():
    """gc as it was after the test: enabled, nothing frozen (a frozen test process would keep its garbage)."""
    import gc

    yield gc
    gc.unfreeze()
    gc.enable()


@pytest.mark.parametrize("words", [["fetch", "--help"], ["--version"], ["fetch", "--fetch-timeout", "x"], ["recipes"]])
def test_a_process_builds_its_parser_without_the_collector_then_freezes_what_it_imported(words, collector, monkeypatch):
    """`prebake` (main reading sys.argv) builds its parser without Python's cyclic collector and freezes
    the objects of its imports (a restore's floor is its imports); the command, which may serve for
    days, runs with the collector again; so does what follows --help or a usage error."""
    import prebake.engine.cli as cli

    seen = []
    real_build, real_check = cli.build_parser, cli._check_store
    monkeypatch.setattr(cli, "build_parser", lambda **kw: seen.append(collector.isenabled()) or real_build(**kw))
    monkeypatch.setattr(cli, "_check_store", lambda args: seen.append(collector.isenabled()) or real_check(args))
    monkeypatch.setattr(sys, "argv", ["prebake", *words])
    collector.unfreeze()
    try:
        main()
    except SystemExit:
        pass
    assert seen == ([False, True] if words == ["recipes"] else [False])  # only `recipes` runs a command
    assert collector.isenabled() and collector.get_freeze_count() > 0


def test_a_caller_of_main_and_a_process_without_the_collector_keep_theirs_as_they_were(collector, monkeypatch):
    """(`fetch`, not `serve`: a process's `serve` forks its cores' probe, not for a test's worker.)"""
    collector.unfreeze()
    with pytest.raises(SystemExit):
        main(["fetch", "--help"])  # a caller's main([...]): a test, an embedding program
    assert collector.isenabled() and collector.get_freeze_count() == 0
    collector.disable()  # a process that turned it off itself keeps it off, and freezes nothing
    monkeypatch.setattr(sys, "argv", ["prebake", "fetch", "--help"])
    with pytest.raises(SystemExit):
        main()
    assert not collector.isenabled() and collector.get_freeze_count() == 0
