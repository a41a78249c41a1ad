"""The import layering holds at every depth: no package imports one above it, nothing circles.

LAYERS lists prebake's packages from the core up to the command line: a package may import its own
layer's modules and any layer below; peers on one layer never import each other. A package is the
node of its own modules (its __init__ and the modules directly in it); its sub-packages are nodes
of their own. Every import counts (module level, inside a function, under TYPE_CHECKING), read
with ast, nothing executed. A package that is not in LAYERS fails the test until it is placed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = "prebake"
FOLDERS = {
    "prebake": "prebake",
    "prebake.artifacts": "artifacts",
    "prebake.registry": "registry",
    "prebake.engine": "engine",
}
LAYERS: tuple[tuple[str, ...], ...] = (
    ("prebake",),
    ("prebake.artifacts",),  # the core's foundation: errors, fsutil, timebox, keys, layout
    ("prebake.artifacts.buckets",),  # bucket sets: rules, traffic fit, reports
    ("prebake.artifacts.bundle",),  # the bundle format: manifest, pack, unpack
    ("prebake.artifacts.ports",),  # what the core needs from a registry, and listing rows
    ("prebake.artifacts.store",),  # the local store and its admin view
    ("prebake.artifacts.store.stats",),  # hit and miss counts: events, the ledger on disk, the report
    ("prebake.artifacts.recipe",),  # recipes, kinds and the keys of a target
    ("prebake.artifacts.fetch",),  # the fetch pipeline, its outcomes, trust gating, the nearest miss
    ("prebake.artifacts.bake",),  # the bake of one kind, doit tasks, the fleet plan, provenance
    ("prebake.registry.trust",),  # signing, policy, policy files, revocation, attestation
    ("prebake.registry.review",),  # verify, promote, write-back, the quarantine's aging
    ("prebake.registry.shared",),  # the registry over the object-store port, verified transfers
    (
        "prebake.registry.backends",
        "prebake.registry.oci",
    ),  # the object stores (folder, S3, Hub, Azure); the OCI registry
    ("prebake.registry",),  # open_registry: an address to a backend, chains
    ("prebake.engine.common",),  # host probe, environment table, logging, the adapter interface, the starter
    ("prebake.engine.bundled.runtime",),  # the bundled engine's model runtime on torch
    ("prebake.engine.bundled.api",),  # its HTTP API
    ("prebake.engine.bundled.variants",),  # its graphs variants, over the runtime
    ("prebake.engine.bundled.snapshot",),  # its process snapshots: CRIU's dump and restore, the snapshot kind
    ("prebake.engine.bundled", "prebake.engine.vllm"),  # one folder per engine (peers)
    ("prebake.engine",),  # the composition root and the registry of adapters
    ("prebake.engine.fleet",),  # baking on a fleet: executors and builder profiles
    ("prebake.engine.cli",),  # the `prebake` command
)


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the tree: its dotted name -> (path, whether it is a package's __init__)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package, folder in FOLDERS.items():
        base = REPO / folder
        paths = [base / "__init__.py"] if package == ROOT else sorted(base.rglob("*.py"))
        for path in paths:
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            if is_init:
                parts.pop()
            found[".".join([package, *parts])] = (path, is_init)
    return found


def _imports(name: str, path: Path, is_init: bool, known: set[str]) -> set[str]:
    """The project modules `name` imports, resolved to the deepest module that exists."""
    package = name if is_init else name.rpartition(".")[0]
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


def _graph() -> tuple[dict[str, set[str]], dict[str, str]]:
    """The module graph, and each module's package (the node it belongs to)."""
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, is_init, known) for name, (path, is_init) in modules.items()}
    for name in list(graph):  # importing a.b.c runs a/__init__ and a/b/__init__ first: not an edge
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    owner = {name: name if is_init else name.rpartition(".")[0] for name, (_, is_init) in modules.items()}
    return graph, owner


def _package_edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the module imports behind that edge."""
    graph, owner = _graph()
    edges: dict[tuple[str, str], list[str]] = {}
    for name, targets in graph.items():
        for target in targets:
            src, dst = owner[name], owner[target]
            if src != dst:
                edges.setdefault((src, dst), []).append(f"{name} imports {target}")
    return edges


def _layer_of() -> dict[str, int]:
    return {package: i for i, layer in enumerate(LAYERS) for package in layer}


def test_every_package_has_a_layer():
    _, owner = _graph()
    layer = _layer_of()
    unplaced = sorted({package for package in owner.values() if package not in layer})
    assert not unplaced, f"packages with no layer (place them in {__name__}.LAYERS): {unplaced}"


def test_no_package_imports_a_layer_above_it_or_a_peer():
    layer = _layer_of()
    offenders = [
        f"{src} (layer {layer[src]}) -> {dst} (layer {layer[dst]}): {'; '.join(sorted(why))}"
        for (src, dst), why in sorted(_package_edges().items())
        if src in layer and dst in layer and layer[dst] >= layer[src]
    ]
    assert not offenders, "imports against the layering:\n" + "\n".join(offenders)


def test_no_import_circles_between_packages():
    circles = _circles(_adjacency(_package_edges()))
    assert not circles, "package circles:\n" + "\n".join(circles)


def test_no_import_circles_between_modules():
    graph, _ = _graph()
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(circles)


def _adjacency(edges: dict[tuple[str, str], list[str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    return graph


def _circles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    circles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return circles


def test_the_checker_sees_circles_upward_imports_peers_and_unplaced_packages(tmp_path, monkeypatch):
    """The tests above can fail: a fake tree with each kind of offence is caught, at depth."""
    tree = {
        "prebake/__init__.py": "",
        "artifacts/__init__.py": "",
        "artifacts/errors.py": "",
        "artifacts/bundle/__init__.py": "",
        "artifacts/bundle/a.py": "from prebake.artifacts.bundle import b\n",
        "artifacts/bundle/b.py": "def f():\n    from prebake.artifacts.bundle import a\n",
        "artifacts/bundle/m.py": "from prebake.artifacts.store.s import x\n",  # upward, two deep
        "artifacts/store/__init__.py": "",
        "artifacts/store/s.py": "from prebake.artifacts.bundle.m import y\n",  # closes a package circle
        "registry/__init__.py": "",
        "engine/__init__.py": "",
        "engine/bundled/__init__.py": "",
        "engine/bundled/x.py": "from prebake.engine.vllm import y\n",  # a peer
        "engine/vllm/__init__.py": "",
        "engine/vllm/y.py": "",
        "engine/newthing/__init__.py": "",  # no layer
    }
    for rel, text in tree.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(
        sys.modules[__name__],
        "LAYERS",
        (("prebake",), ("prebake.artifacts",), ("prebake.artifacts.bundle",), ("prebake.artifacts.store",))
        + (("prebake.registry",), ("prebake.engine.bundled", "prebake.engine.vllm"), ("prebake.engine",)),
    )
    with pytest.raises(AssertionError, match=r"import circles:\n.*prebake\.artifacts\.bundle\.a"):
        test_no_import_circles_between_modules()
    with pytest.raises(AssertionError, match=r"prebake\.artifacts\.bundle .* -> prebake\.artifacts\.store"):
        test_no_package_imports_a_layer_above_it_or_a_peer()
    with pytest.raises(AssertionError, match=r"prebake\.engine\.bundled \(layer 5\) -> prebake\.engine\.vllm"):
        test_no_package_imports_a_layer_above_it_or_a_peer()
    with pytest.raises(AssertionError, match="package circles"):
        test_no_import_circles_between_packages()
    with pytest.raises(AssertionError, match=r"prebake\.engine\.newthing"):
        test_every_package_has_a_layer()


def test_a_new_engine_is_one_adapter_registered_in_one_line(tmp_path, monkeypatch, capsys):
    """`--engine NAME` reaches whatever adapter is registered (adapters.register): no CLI table to extend."""
    from prebake.engine import adapters, cli
    from prebake.engine.common.adapter import EngineSpec, Fetched

    asked: list[tuple[str, str]] = []

    class ToyAdapter:
        spec = EngineSpec(name="toy", kinds=(), fallback_kind="graphs", variants={"inductor-cache": ()})

        def serve_environment(self, plan, installed, run_dir):
            return {}

        def fetch(self, request, services):
            asked.append(("fetch", request.model))
            return Fetched("toy-target", {"TOY_CACHE": "/x"}, {})

        def serve(self, request, open_services):
            asked.append(("serve", request.model))
            return 0

    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(adapters, "ADAPTERS", {**adapters.ADAPTERS, "toy": ToyAdapter()})
    assert cli.main(["fetch", "--engine", "toy", "--model", "tiny-llama"]) == 0
    assert "export TOY_CACHE=/x" in capsys.readouterr().out
    assert cli.main(["serve", "--engine", "toy", "--model", "tiny-llama"]) == 0
    assert asked == [("fetch", "tiny-llama"), ("serve", "tiny-llama")]
