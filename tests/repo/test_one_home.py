"""One home per thing: an error has one import path, a name one meaning, a type one module.

Registry errors are defined in prebake.artifacts.ports.errors and imported from there only (no
second path re-exporting them); registry/shared/transfer.py exports only what it defines (the
port's types come from prebake.artifacts.ports); no two production classes share a name, so
`Launch` or `Prepared` means one thing wherever it is read; the commands only print reports: no
CLI module builds a JSON payload itself (a report's `to_json()` does), nor lays out text itself (a
report's `render()` does: no table, no column widths in engine/cli). Every error class is imported
from the module that defines it, and the function names a review found with several meanings
(REVIEWED_NAMES) have one definition each. The fetch sequence has one home too: only
artifacts/fetch/pipeline.py calls its steps in order.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

from prebake.artifacts.ports import errors as _errors

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("artifacts", "registry", "engine")
ERRORS_HOME = "prebake.artifacts.ports.errors"
REGISTRY_ERRORS = set(_errors.__all__)  # every name the one home defines
# Two classes of one name on purpose, each in a layer that never meets the other's.
# Module-level function names a review found meaning several things (issue 49, item 6): one definition each.
REVIEWED_NAMES = ("resolve", "install", "inventory", "cpu_flags", "describe")
# Text the CLI lays out itself on purpose: (module, function) -> why.
OWN_TEXT = {
    ("engine/cli/__init__.py", "_grouped"): "`prebake --help`'s list of commands is the parser's own text",
}
# The fetch pipeline's steps (issue 49, item 1): a function elsewhere that calls two of them is a
# second copy of the sequence, where the next step would have to be added too.
SEQUENCE_HOME = "artifacts/fetch/pipeline.py"
FETCH_STEPS = ("lookup", "verify", "install")
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


class _TextLayout(ast.NodeVisitor):
    """Each place a module lays out text for people: a call of `table(...)`, or an f-string field
    with a width or an alignment (`{name:<10}`, `{size:>9s}`), with its enclosing function."""

    def __init__(self) -> None:
        self.functions: list[str] = []
        self.found: list[tuple[int, str, str]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "table":
            self.found.append((node.lineno, self._where(), "table(...)"))
        self.generic_visit(node)

    def visit_FormattedValue(self, node: ast.FormattedValue) -> None:
        parts = node.format_spec.values if isinstance(node.format_spec, ast.JoinedStr) else []
        spec = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in parts)
        if any(c in spec for c in "<>^") or any(c.isdigit() for c in spec.split(".")[0]):
            self.found.append((node.lineno, self._where(), f"a field laid out as {spec}"))
        self.generic_visit(node)

    def _where(self) -> str:
        return self.functions[0] if self.functions else "<module>"


def _hand_laid_text(path: Path, source: str | None = None) -> list[str]:
    rel = str(path.relative_to(REPO))
    layout = _TextLayout()
    layout.visit(ast.parse(source if source is not None else path.read_text(), str(path)))
    return [f"{rel}:{line} {where}: {what}" for line, where, what in layout.found if (rel, where) not in OWN_TEXT]


def test_commands_print_reports_and_lay_out_no_text_themselves():
    found = [hit for path in _python_files("engine/cli") for hit in _hand_laid_text(path)]
    assert not found, "give the report a render() and print it:\n" + "\n".join(found)


def test_the_text_check_sees_a_table_and_aligned_columns_but_not_plain_text():
    module = REPO / "engine" / "cli" / "probe_for_the_check.py"
    source = 'def cmd(r):\n    print(table(("A",), []))\n    print(f"{r.kind:9} {r.n:>6}")\n    print(f"{r.seconds:.1f} s {r}")\n'
    assert [hit.split(": ", 1)[1] for hit in _hand_laid_text(module, source)] == [
        "table(...)",
        "a field laid out as 9",
        "a field laid out as >6",
    ]


def _module_path(module: str) -> Path | None:
    """The file of a prebake module (prebake.X.Y -> X/Y.py or X/Y/__init__.py), or None."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    base = REPO.joinpath(*parts)
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


@functools.cache
def _classes_of(path: Path) -> frozenset[str]:
    return frozenset(n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef))


def test_every_error_class_is_imported_from_the_module_that_defines_it():
    found = []
    for path in _python_files(*FOLDERS, "tests", "benchmarks"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("prebake.")):
                continue
            home = _module_path(node.module)
            if home is None:
                continue
            classes = _classes_of(home)
            found += [
                f"{path.relative_to(REPO)}:{node.lineno} imports {a.name} through {node.module}"
                for a in node.names
                if a.name.endswith("Error") and a.name not in classes
            ]
    assert not found, "import each error from its home, not through a module that imports it:\n" + "\n".join(found)


def test_the_reviewed_names_have_one_definition_each():
    homes: dict[str, set[str]] = defaultdict(set)
    for path in _python_files(*FOLDERS):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef) and node.name in REVIEWED_NAMES:
                homes[node.name].add(str(path.relative_to(REPO)))
    several = {name: sorted(paths) for name, paths in homes.items() if len(paths) > 1}
    assert not several, f"one meaning per name: rename all but one of each {several}"


def _steps_sequenced(path: Path, source: str | None = None) -> list[str]:
    """Each function of `path` that calls two or more of the pipeline's steps, as `pipeline.lookup(...)`
    or by a name imported from prebake.artifacts.fetch.pipeline."""
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    imported = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "prebake.artifacts.fetch.pipeline"
        for a in n.names
        if a.name in FETCH_STEPS
    }
    found = []
    for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        called = set()
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            f = call.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "pipeline":
                called |= {f.attr} & set(FETCH_STEPS)
            elif isinstance(f, ast.Name) and f.id in imported:
                called.add(f.id)
        if len(called) > 1:
            found.append(f"{path.relative_to(REPO)}:{func.lineno} {func.name} calls {sorted(called)}")
    return found


def test_the_fetch_steps_are_sequenced_in_one_module():
    found = [hit for path in _python_files(*FOLDERS) if str(path.relative_to(REPO)) != SEQUENCE_HOME
             for hit in _steps_sequenced(path)]  # fmt: skip
    assert not found, f"call {SEQUENCE_HOME}'s resolve, not its steps one by one:\n" + "\n".join(found)


def test_the_sequence_check_sees_the_steps_called_in_order():
    module = REPO / "engine" / "common" / "probe_for_the_check.py"
    source = (
        "from prebake.artifacts.fetch import pipeline\nfrom prebake.artifacts.fetch.pipeline import install\n"
        "def mine(p):\n    pipeline.verify(pipeline.lookup(p))\n    return install(p)\n"
        "def fine(p):\n    return pipeline.resolve(p), store.install(p), registry.lookup(p)\n"
    )
    assert [hit.split(" ", 1)[1] for hit in _steps_sequenced(module, source)] == [
        "mine calls ['install', 'lookup', 'verify']"
    ]


def test_the_registry_a_fetch_opens_is_opened_by_open_registry_itself():
    """issue 49, item 1: the lookup opens its registry with Source.open, which calls the opener the
    Source was given; in the package that opener is prebake.registry.open_registry itself, never a
    closure over another (the four-closure chain Context.source -> Context.registry -> open_address
    -> open_registry is what a reader could not follow)."""
    sources, found = [], []
    for path in _python_files(*FOLDERS):
        for call in (n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.Call)):
            if not (isinstance(call.func, ast.Name) and call.func.id == "Source"):
                continue
            given = {k.arg: k.value for k in call.keywords} | dict(
                zip(("address", "trust", "open_registry"), call.args)
            )
            opener = given.get("open_registry")
            where = f"{path.relative_to(REPO)}:{call.lineno}"
            sources.append(where)
            if not (isinstance(opener, ast.Name) and opener.id == "open_registry"):
                found.append(f"{where} opens its registry with {ast.unparse(opener) if opener else 'nothing'}")
    assert sources, "no Source is made in the package: the check reads the wrong name"
    assert not found, "hand Source prebake.registry.open_registry itself:\n" + "\n".join(found)
