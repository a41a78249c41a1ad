"""The import layering holds: the core imports no edge, registries import no engine, nothing circles.

    artifacts/   the pure core: imports neither registry/ nor engine/
    registry/    backends of the core's ports: may import artifacts/, never engine/
    engine/      everything else: may import both

Every import counts, at module level or inside a function: a function-level import that hides
a circle is still a circle. Imports are read from the source with ast, so nothing is executed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("artifacts", "registry", "engine")
FORBIDDEN = {"artifacts": ("registry", "engine"), "registry": ("engine",)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, resolved to the deepest module that exists."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    for name in list(graph):  # importing a.b.c runs a/__init__ and a/b/__init__ first
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    return graph


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer):
    offenders = [
        f"{name} imports {target}"
        for name, targets in _graph().items()
        if name.split(".")[0] == layer
        for target in sorted(targets)
        if target.split(".")[0] in FORBIDDEN[layer]
    ]
    assert not offenders, f"{layer}/ must not import {' or '.join(FORBIDDEN[layer])}/:\n" + "\n".join(offenders)


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_the_checker_sees_a_circle_and_a_forbidden_import(tmp_path, monkeypatch):
    """The test above can fail: a fake tree with a circle and an upward import is caught."""
    for pkg, body in {
        "artifacts": {
            "__init__.py": "",
            "a.py": "from artifacts import b\n",
            "b.py": "def f():\n    from artifacts import a\n",
        },
        "registry": {"__init__.py": "", "r.py": "import engine.e\n"},
        "engine": {"__init__.py": "", "e.py": ""},
    }.items():
        (tmp_path / pkg).mkdir()
        for file, text in body.items():
            (tmp_path / pkg / file).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    graph = _graph()
    assert "artifacts.a" in graph["artifacts.b"] and "artifacts.b" in graph["artifacts.a"]
    assert "engine.e" in graph["registry.r"]
    with pytest.raises(AssertionError, match="import circles"):
        test_no_import_circles()
    with pytest.raises(AssertionError, match="registry.r imports engine.e"):
        test_a_layer_imports_nothing_above_it("registry")


def test_every_engine_the_cli_offers_is_an_adapter_with_a_fetch_and_a_serve_path():
    from engine.adapters import ADAPTERS
    from engine.cli.common import ENGINES
    from engine.cli.serving import FETCH_PATHS, SERVE_PATHS

    assert set(ENGINES) == {a.name for a in ADAPTERS} == set(FETCH_PATHS) == set(SERVE_PATHS)
