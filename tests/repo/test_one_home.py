"""One home per thing: an error has one import path, a name one meaning, a type one module.

Registry errors are defined in prebake.artifacts.ports.errors and imported from there only (no
second path re-exporting them); registry/shared/transfer.py exports only what it defines (the
port's types come from prebake.artifacts.ports); no two production classes share a name, so
`Launch` or `Prepared` means one thing wherever it is read; the commands only print reports: no
CLI module builds a JSON payload itself (a report's `to_json()` does).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from prebake.artifacts.ports import errors as _errors

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("artifacts", "registry", "engine")
ERRORS_HOME = "prebake.artifacts.ports.errors"
REGISTRY_ERRORS = set(_errors.__all__)  # every name the one home defines
# Two classes of one name on purpose, each in a layer that never meets the other's.
SHARED_CLASS_NAMES = {
    "Request": "the bucket fit's traced request (artifacts/buckets) and the runtime scheduler's",
    "Completion": "the HTTP API's wire model and the runtime scheduler's result it is filled from",
}


def _python_files(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((REPO / folder).rglob("*.py"))]


def test_registry_errors_are_imported_from_their_one_home():
    found = []
    for path in _python_files(*FOLDERS, "tests", "benchmarks", "docs"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != ERRORS_HOME and node.module:
                names = sorted(a.name for a in node.names if a.name in REGISTRY_ERRORS)
                if names and node.module.startswith("prebake"):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {names} from {node.module}")
    assert not found, f"import registry errors from {ERRORS_HOME}:\n" + "\n".join(found)
    assert not (REPO / "registry" / "errors.py").exists(), "a second path for the registry errors is back"


def test_shared_transfer_exports_only_what_it_defines():
    path = REPO / "registry" / "shared" / "transfer.py"
    tree = ast.parse(path.read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    exported = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
    )
    assert set(exported) <= defined, f"transfer.py re-exports {sorted(set(exported) - defined)}"


def test_no_two_production_classes_share_a_name():
    homes: dict[str, list[str]] = defaultdict(list)
    for path in _python_files(*FOLDERS):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                homes[node.name].append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in homes.items() if len(paths) > 1 and name not in SHARED_CLASS_NAMES}
    assert not shared, f"one meaning per name: rename one of each {shared}"


def _hand_built_json(path: Path) -> list[str]:
    """json.dumps (or a CLI's own json printer) of a literal dict, list or comprehension, and functions
    returning a dict literal."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    own = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "to_json" for n in ast.walk(f)}
    for node in ast.walk(tree):
        if id(node) in own:  # a report type of the CLI's own (outcome.Failure) renders itself
            continue
        if isinstance(node, ast.Call) and ("dumps" in ast.unparse(node.func) or "json" in ast.unparse(node.func)):
            literal = (ast.Dict, ast.DictComp, ast.List, ast.ListComp)
            if node.args and any(isinstance(n, literal) for n in ast.walk(node.args[0])):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} dumps a payload built here")
        if isinstance(node, ast.FunctionDef) and node.name != "to_json":
            returns = [n for n in ast.walk(node) if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict)]
            if returns and any(isinstance(k, ast.Constant) for k in returns[0].value.keys):  # type: ignore[union-attr]
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} builds a JSON payload")
    return found


def test_commands_print_reports_and_build_no_json_themselves():
    found = [hit for path in _python_files("engine/cli") for hit in _hand_built_json(path)]
    assert not found, "give the report a to_json() and print it:\n" + "\n".join(found)
