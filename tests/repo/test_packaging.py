"""The wheel lists every package of the tree, and ships the recipes as package data."""

from __future__ import annotations

import tomllib

from tests.support.baking import REPO


def test_every_python_package_of_the_tree_is_in_the_wheel():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(("prebake", *init.parent.relative_to(REPO).parts))
        for top in ("artifacts", "engine", "registry")
        for init in (REPO / top).rglob("__init__.py")
    }
    assert found <= listed, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
    assert "prebake.recipes" in listed


def test_the_one_import_package_maps_onto_the_top_level_folders_and_the_checkout_links_them():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {p.split(".")[0] for p in setuptools["packages"]} == {"prebake"}
    folders = {"prebake.artifacts": "artifacts", "prebake.engine": "engine", "prebake.registry": "registry"}
    for package, folder in {**folders, "prebake.recipes": "recipes"}.items():
        assert setuptools["package-dir"][package] == folder
        link = REPO / "prebake" / folder
        assert link.is_symlink() and link.resolve() == (REPO / folder).resolve(), (
            f"prebake/{folder} links to ../{folder}"
        )


def test_the_shipped_recipes_are_package_data():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["prebake.recipes"] == "recipes"
    assert setuptools["package-data"]["prebake.recipes"] == ["*.toml"]


def test_the_kernels_source_is_package_data():
    # runtime.dot compiles its C++ source at bake: a wheel without it could not bake on AMX
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"].get("prebake.engine.bundled.runtime", [])
    sources = sorted((REPO / "engine" / "bundled" / "runtime").glob("*.cpp"))
    assert sources, "the kernel's source is where runtime.dot reads it"
    assert all(any(s.match(p) for p in patterns) for s in sources)
