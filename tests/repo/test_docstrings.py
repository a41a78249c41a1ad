"""Module docstrings say what a module is in a few lines; dates and measurements live in docs/, not in code."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("artifacts", "engine", "registry", "recipes", "benchmarks")
MAX_LINES = 12
# Modules allowed up to TREE_MAX_LINES, and why: an on-disk tree drawing, or a script's --help.
TREE_MAX_LINES = 20
LONGER = {
    "artifacts/store/local.py": "draws the store's on-disk tree",
    "engine/bundled/cache_layout.py": "draws the bundle's installed trees",
    "engine/vllm/process.py": "draws the run folder vLLM starts from",
    "engine/vllm/cache_tree.py": "draws the vLLM cache root a kernel-cache image takes",
}
SCRIPTS = "benchmarks/"  # a benchmark's docstring is its --help: it keeps its usage block
DATE = re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b")
FIX = "keep what the module is and what it may touch; move narrative and dated measurements to docs/"


def _modules() -> list[Path]:
    paths = [REPO / "dodo.py"]
    for package in PACKAGES:
        paths += sorted((REPO / package).rglob("*.py"))
    return paths


def _limit(rel: str) -> int:
    return TREE_MAX_LINES if rel in LONGER or rel.startswith(SCRIPTS) else MAX_LINES


def _docstrings(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def test_every_module_has_a_short_docstring():
    problems = []
    for path in _modules():
        rel = str(path.relative_to(REPO))
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        if not doc or not doc.strip():
            problems.append(f"{rel}: no module docstring")
        elif (lines := len(doc.strip().splitlines())) > _limit(rel):
            problems.append(f"{rel}: module docstring of {lines} lines (at most {_limit(rel)})")
    assert not problems, f"{FIX}:\n  " + "\n  ".join(problems)


def test_no_comment_or_docstring_carries_a_date():
    problems = []
    for path in _modules():
        rel = str(path.relative_to(REPO))
        text = path.read_text(encoding="utf-8")
        for line, doc in _docstrings(ast.parse(text)):
            if match := DATE.search(doc):
                problems.append(f"{rel}:{line + doc[: match.start()].count(chr(10))}: docstring dated {match[0]}")
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT and (match := DATE.search(token.string)):
                problems.append(f"{rel}:{token.start[0]}: comment dated {match[0]}")
    assert not problems, "measurements and their dates live in docs/ (docs/performance.md):\n  " + "\n  ".join(problems)


def test_the_allowlist_names_modules_that_exist():
    missing = [rel for rel in LONGER if not (REPO / rel).is_file()]
    assert not missing, f"tests/repo/test_docstrings.py allows longer docstrings to modules that are gone: {missing}"
