"""Every list of registry schemes is read from one table, registry/schemes.py's BACKENDS.

A module whose collection holds two schemes (a tuple of prefixes, a dict keyed by scheme) or whose
text names three (a help text, a docstring listing addresses) keeps a hand copy that goes stale
when a backend is added: it should build its text from the table (`address_forms()`, `SCHEMES`).
An example command naming its source and destination addresses is no list and is allowed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from prebake.artifacts.extras import EXTRAS
from prebake.registry.schemes import BACKENDS, SCHEMES, backend_of

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "registry" / "schemes.py"
FOLDERS = ("artifacts", "registry", "engine", "prebake")


def _strings(nodes: list[ast.expr | None]) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _text(node: ast.AST) -> str | None:
    """The literal text of a string or an f-string (its literal parts), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_strings(list(node.values)))
    return None


def _schemes_in(text: str) -> set[str]:
    return {s for s in SCHEMES if re.search(rf"(?<![\w-]){re.escape(s)}", text)}


def _hand_copies(path: Path) -> list[str]:
    """Collections holding two schemes or more as members, and texts naming three or more."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            named = {t for t in _strings(list(node.elts)) if t in SCHEMES}
            listed = len(named) >= 2
        elif isinstance(node, ast.Dict):
            named = {t for t in _strings(node.keys) if t in SCHEMES}
            listed = len(named) >= 2
        elif (text := _text(node)) is not None:
            named = _schemes_in(text)
            listed = len(named) >= 3
        else:
            continue
        if listed:
            found.append(f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')} names {sorted(named)}")
    return found


def test_no_module_lists_schemes_by_hand():
    paths = [p for folder in FOLDERS for p in sorted((REPO / folder).rglob("*.py")) if p != TABLE]
    paths.append(REPO / "dodo.py")
    found = [hit for path in paths for hit in _hand_copies(path)]
    assert not found, "build these from registry/schemes.py's table instead:\n" + "\n".join(found)


def test_every_row_has_a_known_extra_and_one_scheme():
    assert len(set(SCHEMES)) == len(SCHEMES)
    for backend in BACKENDS:
        assert backend.extra is None or backend.extra in EXTRAS, backend
        assert backend_of(backend.form) is backend, f"{backend.form!r} does not open as {backend.scheme}"


def test_docs_describe_every_backend():
    page = (REPO / "docs" / "registries.md").read_text()
    table = [line for line in page.splitlines() if line.startswith("| `")]
    missing = [b.scheme for b in BACKENDS if not any(f"`{b.scheme}" in line for line in table)]
    assert not missing, f"docs/registries.md's table of addresses lacks {missing}"
