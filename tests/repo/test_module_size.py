"""No module of prebake over MAX_LINES lines without a reason stated in docs/development.md.

The reasons live in one table of docs/development.md, under the heading SECTION: one row per module,
its path and why it stays whole. A module over the limit without a row fails; so does a row whose
module is gone or back under the limit (the table says only what is true of the tree).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("artifacts", "registry", "engine")
MAX_LINES = 400
DOC = REPO / "docs" / "development.md"
SECTION = "## Modules over 400 lines"
_ROW = re.compile(r"^\|\s*`?([\w/]+\.py)`?\s*\|\s*(.*?)\s*\|\s*$")


def stated_reasons(text: str) -> dict[str, str]:
    """module path -> reason, from the table under SECTION (up to the next heading of its level)."""
    _, found, rest = text.partition("\n" + SECTION + "\n")
    assert found, f"{DOC.relative_to(REPO)} has no section {SECTION!r}"
    body = re.split(r"\n## ", rest, maxsplit=1)[0]
    return {m[1]: m[2] for line in body.splitlines() if (m := _ROW.match(line))}


def _long_modules() -> dict[str, int]:
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for folder in FOLDERS
        for path in sorted((REPO / folder).rglob("*.py"))
    }
    return {path: n for path, n in sizes.items() if n > MAX_LINES}


def test_every_module_over_the_limit_has_a_stated_reason():
    reasons = stated_reasons(DOC.read_text())
    unstated = [f"{path} ({n} lines)" for path, n in _long_modules().items() if not reasons.get(path, "").strip()]
    assert not unstated, (
        f"cut these modules to {MAX_LINES} lines or state why they stay whole in {DOC.relative_to(REPO)}, "
        f"{SECTION!r}:\n" + "\n".join(unstated)
    )


def test_every_stated_reason_names_a_module_still_over_the_limit():
    stale = sorted(set(stated_reasons(DOC.read_text())) - set(_long_modules()))
    assert not stale, f"remove these rows from {SECTION!r}: the module is gone or within {MAX_LINES} lines: {stale}"


def test_the_table_is_read_row_by_row():
    text = f"intro\n{SECTION}\n\n| module | why |\n|---|---|\n| `a/b.py` | one class |\n\n## Next\n| `c/d.py` | x |\n"
    assert stated_reasons(text) == {"a/b.py": "one class"}
