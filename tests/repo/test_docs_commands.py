"""The commands the docs show are the commands the code has: every `prebake ...` and `doit ...`
line in a shell block of README.md and docs/ is parsed against the CLI (doit's against the
variables bake takes), output the docs show is compared where it is deterministic, and the one
exit-code table in docs/commands.md is the ExitCode enum."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from prebake.artifacts.bake.tasks import BAKE_VARIABLES
from prebake.artifacts.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_PREFIX = re.compile(r"^(?:\$ )?(?:\S+=\S+ )*(?:\.venv/bin/|\$\(BIN\)/)?(prebake|doit)( |$)")


def _blocks(text: str) -> list[tuple[int, list[str]]]:
    """The shell-like blocks of a page: fenced (no language, sh, bash, console) and indented by four
    spaces (markdown's indented code), each as (first line number, lines)."""
    blocks, current, start, shell = [], [], 0, False
    inside = False
    indented: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not inside and line.startswith("    ") and line.strip():
            if not indented:
                start = number
            indented.append(line)
            continue
        if indented:
            blocks.append((start, indented))
            indented = []
        if line.startswith("```"):
            if inside:
                if shell:
                    blocks.append((start, current))
                inside, current = False, []
            else:
                inside, start, shell = True, number + 1, line[3:].strip() in ("", "sh", "bash", "console", "shell")
            continue
        if inside:
            current.append(line)
    return blocks


def _shown_commands() -> list[tuple[str, int, str]]:
    """(page, line number, command) of every prebake/doit command line in a shell block."""
    found = []
    for page in PAGES:
        for start, lines in _blocks(page.read_text()):
            first = next((line for line in lines if line.strip()), "")
            if first.startswith(OUTPUT_STARTS):  # a block of output (an error shown), not of commands
                continue
            for offset, line in _joined(lines):
                if _is_output(line.strip().removeprefix("$ ")):
                    continue
                command = _strip(line)
                if _PREFIX.match(command):
                    found.append((page.relative_to(REPO).as_posix(), start + offset, command))
    return found


OUTPUT_STARTS = ("TaskFailed", "Traceback", "miss:", "prebake: ", "{")


def _joined(lines: list[str]) -> list[tuple[int, str]]:
    """Lines with their `\\` continuations joined, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for i, line in enumerate(lines):
        if pending is not None:
            pending = (pending[0], pending[1] + " " + line.strip())
        else:
            pending = (i, line)
        if pending[1].rstrip().endswith("\\"):
            pending = (pending[0], pending[1].rstrip()[:-1])
            continue
        out.append(pending)
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def _is_output(line: str) -> bool:
    """A log line (`prebake serve: ...`) or a diagram (`a -> b`), not a command."""
    words = line.split()
    return bool(words) and (words[0].endswith(":") or (len(words) > 1 and words[1].endswith(":")) or " -> " in line)


def _strip(line: str) -> str:
    """The command of a shell line: no comment, no trailing `&`, `|` or `>` part, no leading `eval "$(`."""
    line = line.strip()
    line = re.sub(r'^eval "\$\((.*)\)"', r"\1", line)
    line = re.split(r"\s+#\s", line, maxsplit=1)[0]
    line = re.split(r"(?<=\S)\s{3,}(?=[a-z(])", line, maxsplit=1)[0]  # a synopsis line's description column
    line = re.split(r"\s[|>]|\s&&\s", line, maxsplit=1)[0]
    return line.removesuffix("&").strip()


def _words(command: str) -> list[str]:
    """The words of a shown command, its [optional] parts kept, `a|b` alternatives taken at their first."""
    command = command.replace("[", " ").replace("]", " ").replace("...", " ")
    words = shlex.split(command)
    words = [w.split("|")[0] if re.fullmatch(r"[\w.:/-]+(\|[\w.:/-]+)+", w) else w for w in words]
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value before the command
        words.pop(0)
    return [PLACEHOLDERS.get(w, w) for w in words if w]


PLACEHOLDERS = {"N": "1", "SECONDS": "5"}  # a synopsis's placeholders for numbers (strings parse as they are)


SHOWN = _shown_commands()


def test_the_docs_show_commands_at_all():
    assert len(SHOWN) > 40 and {p for p, _, _ in SHOWN} >= {"README.md", "docs/quickstart.md", "docs/commands.md"}


@pytest.mark.parametrize(
    "page, line, command", [s for s in SHOWN if "prebake" in s[2].split()[0]], ids=lambda v: str(v)
)
def test_every_prebake_command_the_docs_show_parses(page, line, command, capsys):
    from prebake.engine.cli import build_parser

    words = _words(command)[1:]
    if words in ([], ["--version"], ["--help"]) or "--help" in words:
        return
    try:
        build_parser().parse_args(words)
    except SystemExit:
        pytest.fail(f"{page}:{line}: `{command}` does not parse: {capsys.readouterr().err.strip().splitlines()[-1]}")


@pytest.mark.parametrize("page, line, command", [s for s in SHOWN if s[2].split()[0].endswith("doit")], ids=str)
def test_every_doit_command_the_docs_show_uses_known_variables(page, line, command):
    words = _words(command)[1:]
    assert words and words[0] in ("bake", "list", "help", "run", "info", "forget"), f"{page}:{line}: {command}"
    variables = [w.split("=", 1)[0] for w in words if "=" in w and not w.startswith("-")]
    unknown = [v for v in variables if v not in BAKE_VARIABLES]
    assert not unknown, f"{page}:{line}: `{command}` passes {unknown}; doit bake takes {list(BAKE_VARIABLES)}"


# -- shown output, where it is deterministic --------------------------------------------------------


def _output_after(page: str, command: str) -> list[str]:
    """The lines a shell block shows right after `command` (up to a blank line or the block's end)."""
    for _, lines in _blocks((REPO / page).read_text()):
        for i, line in enumerate(lines):
            if _strip(line).removeprefix("$ ") == command:
                out = []
                for after in lines[i + 1 :]:
                    if not after.strip() or _PREFIX.match(_strip(after)):
                        break
                    out.append(after.rstrip())
                indent = min(len(x) - len(x.lstrip()) for x in [line, *out] if x.strip())
                return [x[indent:] for x in out]
    raise AssertionError(f"{page} shows no `{command}`")


def test_the_bucket_counts_shown_without_a_trace_are_what_prebake_buckets_prints(capsys):
    from prebake.engine.cli import main

    shown = _output_after("docs/buckets.md", "prebake buckets --model llama3-8b")
    assert main(["buckets", "--model", "llama3-8b"]) == 0
    assert capsys.readouterr().out.splitlines() == shown


def test_the_plan_schema_shown_is_what_plan_json_prints(capsys, tmp_path, monkeypatch):
    from prebake.engine.cli import main

    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path))
    assert main(["plan", "--model", "tiny-llama", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    text = (REPO / "docs" / "fleet.md").read_text()
    assert f'"schema": "{data["schema"]}"' in text
    for field in data["targets"][0]:
        assert f"`{field}`" in text or f'"{field}"' in text, f"docs/fleet.md does not describe plan field {field}"


# -- one table of exit codes -------------------------------------------------------------------------


def _exit_table() -> dict[int, str]:
    text = (REPO / "docs" / "commands.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d) \| `(\w+)` \|", section, re.M)
    return {int(code): name for code, name in rows}


def test_commands_md_holds_one_exit_code_table_that_is_the_enum():
    assert _exit_table() == {int(c): c.name for c in ExitCode}
    pages_with_tables = [
        p.name
        for p in PAGES
        if re.search(r"^\| *(exit code|exit status|code *\| *name) *\|", p.read_text(), re.M | re.I)
    ]
    assert pages_with_tables == ["commands.md"], "one table of exit codes, in docs/commands.md"


def test_the_cli_docstring_and_the_outcome_table_name_the_same_codes():
    from prebake.engine.cli import outcome

    listed = dict(re.findall(r"^\s+(\d) (\w+) ", outcome.__doc__ or "", re.M))
    assert {int(k): v for k, v in listed.items()} == {int(c): c.name for c in ExitCode}
