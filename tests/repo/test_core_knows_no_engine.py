"""The core (artifacts/) names no engine in its code: an engine's packages, settings, kinds and
variables are its adapter's (engine/<engine>/). Docstrings, comments and sentences (messages,
the citation of the upstream whose bucket rules artifacts/buckets/rules.py reimplements) may name
one; identifiers and word-like strings (a factor, a variable, a package) may not, nor a string that
names a graphs variant (the bundled engine's, but for VARIANT_NAMED's reasons), message or not. The registry layer
knows images, layers and annotations: no file or folder name an engine's module declares (a foreign
engine's cache tree is said once, in engine/<engine>/) appears in registry/'s code."""

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


def _declared_names(path: Path) -> set[str]:
    """The module-level string constants of an engine module that read as a name (no space)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            text = node.value.value
            if len(text) >= 6 and not any(c.isspace() for c in text):
                found.add(text)
    return found


def test_the_registry_repeats_no_name_of_an_engines_tree():
    declared = {
        name: path
        for engine in ENGINES
        for path in sorted((REPO / "engine" / engine).glob("*.py"))
        for name in _declared_names(path)
    }
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r} (declared in {declared[node.value].relative_to(REPO)})"
        for path in sorted((REPO / "registry").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in declared
    ]
    assert declared, "no engine module declares a name: the check reads the wrong folder"
    assert not found, "an engine's tree described in the registry layer; let the engine describe it:\n" + "\n".join(
        found
    )


# Where the core names a graphs variant in code, on purpose: (module, name) -> why.
VARIANT_NAMED = {
    ("artifacts/recipe/schema.py", "dynamo-precompile"): "recipes that say its first name, 'aoti', still load",
}


def _variant_names() -> set[str]:
    """The bundled engine's graphs variants, as their classes declare them (`name = "..."`)."""
    found = set()
    for path in (REPO / "engine" / "bundled" / "variants").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            for item in node.body if isinstance(node, ast.ClassDef) else ():
                named = isinstance(item, ast.Assign) and any(getattr(t, "id", "") == "name" for t in item.targets)
                if named and isinstance(item.value, ast.Constant) and isinstance(item.value.value, str):
                    found.add(item.value.value)
    return found


def test_the_core_names_no_graphs_variant_outside_its_prose():
    variants = _variant_names()
    found = [
        f"{path.relative_to(REPO)}:{line}: {text[:80]!r} names {variant}"
        for path in sorted((REPO / "artifacts").rglob("*.py"))
        for line, text in _strings(path)
        for variant in variants
        if variant in text and (str(path.relative_to(REPO)), variant) not in VARIANT_NAMED
    ]
    assert len(variants) >= 3, f"the check reads the variants from the wrong place: {variants}"
    assert not found, "a graphs variant named in the core; let the engine's variants say it:\n" + "\n".join(found)


def _strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string of the module that is not a docstring."""
    tree = ast.parse(path.read_text())
    prose = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]
