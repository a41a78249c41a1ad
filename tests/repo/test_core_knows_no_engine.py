"""The core (artifacts/) names no engine in its code: an engine's packages, settings, kinds and
variables are its adapter's (engine/<engine>/). Docstrings, comments and sentences (messages,
the citation of the upstream whose bucket rules artifacts/buckets/rules.py reimplements) may name
one; identifiers and word-like strings (a factor, a variable, a package) may not."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINES = ("vllm", "sglang")  # every engine but prebake's own, which is the project's name


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _code_names(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every identifier and non-docstring string of the module that names an engine."""
    tree = ast.parse(path.read_text())
    prose = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            text = None if any(c.isspace() for c in node.value) else node.value  # a sentence is prose
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.arg):
            text = node.name if not isinstance(node, ast.arg) else node.arg
        if text and any(engine in text.lower() for engine in ENGINES):
            hits.append((getattr(node, "lineno", 0), text))
    return hits


def test_the_core_names_no_engine_outside_its_prose():
    found = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for path in sorted((REPO / "artifacts").rglob("*.py"))
        for line, text in _code_names(path)
    ]
    assert not found, "engine knowledge in the core; move it to the engine's adapter:\n" + "\n".join(found)


def test_the_check_sees_an_engine_name_in_code_and_not_in_prose(monkeypatch):
    module = REPO / "artifacts" / "_probe_for_the_check.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: '"""vllm prose."""\nX = {"vllm_gaudi": 1}  # vllm\n')
    assert _code_names(module) == [(2, "vllm_gaudi")]
