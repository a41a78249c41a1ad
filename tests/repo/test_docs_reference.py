"""The reference pages cannot drift: every CLI option and every PREBAKE_* variable the code reads is on them."""

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from prebake.engine.common.environment import VARIABLES, variable
from prebake.registry.backends.s3_client import S3Settings

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

FIX = "run `python docs/gen_reference.py` and commit docs/reference/"


def _sections(page: str) -> dict[str, str]:
    """`## `prebake x y`` heading -> the text under it."""
    parts = re.split(r"^## `(prebake[^`]*)`\n", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_reference_pages_are_what_the_code_generates_now():
    for path, text in gen.pages().items():
        assert path.exists(), f"{path.relative_to(ROOT)} is missing: {FIX}"
        assert path.read_text(encoding="utf-8") == text, f"{path.relative_to(ROOT)} is stale: {FIX}"


def test_every_command_and_option_is_on_the_cli_page():
    sections = _sections(gen.CLI_PAGE.read_text(encoding="utf-8"))
    missing = []
    for path, parser, _help in gen.commands():
        if not path:
            continue
        name = "prebake " + " ".join(path)
        if name not in sections:
            missing.append(name)
            continue
        for action in gen.options(parser):
            for flag in action.option_strings or [action.metavar or action.dest]:
                if f"`{flag}`" not in sections[name]:
                    missing.append(f"{name} {flag}")
    assert not missing, f"not on docs/reference/cli.md: {missing}; {FIX}"


def test_the_new_operator_commands_are_documented():
    sections = _sections(gen.CLI_PAGE.read_text(encoding="utf-8"))
    for name in ("prebake store ls", "prebake store verify", "prebake store rm", "prebake stats", "prebake gc"):
        assert "`--json`" in sections[name]


def test_every_prebake_variable_the_code_reads_is_in_the_table_and_on_the_page():
    page = gen.ENV_PAGE.read_text(encoding="utf-8")
    found = gen.variables_read_by_code()
    assert "PREBAKE_HOME" in found and "PREBAKE_SIGNING_KEY_NAME" in found  # the scan sees the code
    undocumented = []
    for name in found:
        if name.endswith("_"):  # a family: f"PREBAKE_S3_{field}"
            ok = any(v.name.startswith(name) for v in VARIABLES)
        else:
            ok = variable(name) is not None and f"`{name}`" in page
        if not ok:
            undocumented.append(f"{name} (in {', '.join(found[name])})")
    assert not undocumented, f"describe these in engine/common/environment.py, then {FIX}: {undocumented}"


def test_every_s3_setting_has_its_documented_variable():
    for f in dataclasses.fields(S3Settings):
        assert variable(f"PREBAKE_S3_{f.name.upper()}") is not None, f"PREBAKE_S3_{f.name.upper()}"


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ('NEW_ENV = "PREBAKE_NEW_THING"', ["PREBAKE_NEW_THING"]),
        ("os.environ.get('PREBAKE_OTHER', '')", ["PREBAKE_OTHER"]),
        ('var = f"PREBAKE_S3_{name.upper()}"', ["PREBAKE_S3_"]),
        ("PREBAKE_VERSION = '0.1.0'", []),  # a Python constant, not a variable
        ('raise Error(f"set {MAX_BYTES_ENV}")', []),
    ],
)
def test_the_scan_finds_variable_names_in_string_literals_only(source, names):
    assert [m[1] for m in gen._LITERAL.finditer(source)] == names


def test_every_table_row_is_described_once():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names))
    assert all(v.description.strip() and v.default.strip() for v in VARIABLES)
