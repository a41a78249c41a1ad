"""The graphs variants stay behind their interface: no module outside engine/bundled/variants/
compares a variant's name (the schema's check of a recipe against an engine's variants aside),
and each variant is one module and one registration line in the package's __init__."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "engine" / "bundled" / "variants"
ALLOWED = {PACKAGE, REPO / "artifacts" / "recipe" / "schema.py"}  # the variants' modules; a recipe's validation
NAMES = {"aoti-package", "dynamo-precompile", "inductor-cache", "aoti"}
CONSTANTS = {"AOTI_PACKAGE", "PRECOMPILE", "INDUCTOR_CACHE", "DEFAULT_VARIANT", "NO_FALLBACK", "variant", "fallback"}


def _operands(node: ast.Compare):
    for operand in (node.left, *node.comparators):
        yield operand
        if isinstance(operand, ast.Tuple | ast.List | ast.Set):
            yield from operand.elts


def _names_a_variant(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Name):
        return node.id in CONSTANTS
    return isinstance(node, ast.Attribute) and node.attr in CONSTANTS


def variant_comparisons(source: str) -> list[int]:
    """The lines of `source` that compare a graphs variant (a name, a variant constant, `variant`)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare) and any(_names_a_variant(o) for o in _operands(node))
    ]


def _modules():
    for top in ("artifacts", "engine", "registry"):
        for path in sorted((REPO / top).rglob("*.py")):
            if not any(path == a or a in path.parents for a in ALLOWED):
                yield path


def test_no_variant_name_is_compared_outside_the_variants_modules():
    found = [f"{p.relative_to(REPO)}:{line}" for p in _modules() for line in variant_comparisons(p.read_text())]
    assert not found, (
        "a graphs variant compared outside engine/bundled/variants/: ask the variant instead "
        "(needs_inductor, reads_in_place, key_factors, next_in, ...):\n" + "\n".join(found)
    )


def test_the_check_sees_a_comparison_by_name_constant_or_variable():
    source = 'if variant == "aoti-package":\n    pass\nx = a != AOTI_PACKAGE\ny = "dynamo-precompile" in (b, c)\nz = v == 1\n'
    assert variant_comparisons(source) == [1, 3, 4]


def test_each_variant_is_its_module_and_one_registration_line():
    init = ast.parse((PACKAGE / "__init__.py").read_text())
    calls = [
        node
        for node in init.body
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == "register"
    ]
    registered = [ast.unparse(call.value.args[0]) for call in calls]
    assert all(call.lineno == call.end_lineno for call in calls), "one registration per line"
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "base"))
    classes = {
        node.name: path.stem
        for path in PACKAGE.glob("*.py")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "GraphsVariant" for b in node.bases)
    }
    assert sorted(classes.values()) == modules, "one GraphsVariant per module"
    assert sorted(registered) == sorted(f"{name}()" for name in classes), registered
