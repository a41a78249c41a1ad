"""The wheel lists every package of the tree, and ships the recipes as package data."""

from __future__ import annotations

import tomllib

from tests.support.baking import REPO


def test_every_python_package_of_the_tree_is_in_the_wheel():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in ("artifacts", "engine", "registry")
        for init in (REPO / top).rglob("__init__.py")
    }
    assert found <= listed, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
    assert "prebake_recipes" in listed


def test_the_shipped_recipes_are_package_data():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["prebake_recipes"] == "recipes"
    assert setuptools["package-data"]["prebake_recipes"] == ["*.toml"]
