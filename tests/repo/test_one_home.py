"""One home per thing: an error has one import path, a name one meaning, a type one module.

Registry errors are defined in prebake.artifacts.ports.errors and imported from there only (no
second path re-exporting them); registry/shared/transfer.py exports only what it defines (the
port's types come from prebake.artifacts.ports); no two production classes share a name, so
`Launch` or `Prepared` means one thing wherever it is read.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("artifacts", "registry", "engine")
ERRORS_HOME = "prebake.artifacts.ports.errors"
REGISTRY_ERRORS = {
    "BlobDigestMismatch",
    "BlobSizeMismatch",
    "PublishConflict",
    "RegistryError",
    "RegistryNotFound",
    "RegistryReadOnly",
    "RegistryUnavailable",
    "UnknownRegistryError",
    "UntrustedEntryError",
    "is_fault",
}
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
