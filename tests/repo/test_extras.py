"""Dependencies by use: pyproject.toml's extras and prebake.artifacts.extras agree, and every package the
code imports is declared, by the bare wheel or by an extra (directly or through what they bring)."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from prebake.artifacts.extras import EXTRAS
from tests.support.baking import REPO
from tests.support.site_subset import closure

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
GROUPS = {"all", "dev"}  # extras that gather others, not a feature's
ENGINES_OWN = {"transformers"}  # imported by the vLLM engine's child, in vLLM's own environment


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


@functools.cache
def _providers() -> dict[str, list[str]]:
    return md.packages_distributions()


def _distributions(module: str) -> set[str]:
    return {canonicalize_name(d) for d in _providers().get(module, [])}


def test_each_features_extra_is_the_table_the_code_checks():
    declared = {k: v for k, v in PROJECT["optional-dependencies"].items() if k not in GROUPS}
    assert set(declared) == set(EXTRAS), "an extra in pyproject.toml and prebake.artifacts.extras differs"
    for extra, modules in EXTRAS.items():
        provided = set().union(*(_distributions(m.split(".")[0]) for m in modules))
        # a namespace package (azure.*) is provided by several distributions: the extra's own and what they bring
        names = _names(declared[extra])
        assert names <= provided <= names | set(closure(declared[extra])), f"[{extra}]: {modules} vs {declared[extra]}"


def _gathered(group: str) -> set[str]:
    requirements = [Requirement(r) for r in PROJECT["optional-dependencies"][group]]
    return {e for r in requirements if r.name == "prebake" for e in r.extras}


def test_all_gathers_every_extra_but_ray_and_dev_gathers_all_and_ray():
    assert _gathered("all") == set(EXTRAS) - {"ray"}
    assert _gathered("dev") == {"all", "ray"}


def test_the_bare_wheel_declares_no_extras_package():
    bare = _names(PROJECT["dependencies"])
    for extra, modules in EXTRAS.items():
        for module in modules:
            assert not _distributions(module.split(".")[0]) & bare, f"{module} ([{extra}]) is a bare dependency"


def test_every_package_the_code_imports_is_declared():
    everything = [
        *PROJECT["dependencies"],
        *(r for k, v in PROJECT["optional-dependencies"].items() if k != "dev" for r in v),
    ]
    brought = set(closure(r for r in everything if "prebake" not in r))
    undeclared = {}
    for folder in ("artifacts", "engine", "registry"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"prebake"} - ENGINES_OWN:
                    if not _distributions(top) & brought:
                        undeclared.setdefault(top, str(path.relative_to(REPO)))
    assert not undeclared, f"imported but declared by no dependency or extra: {undeclared}"
