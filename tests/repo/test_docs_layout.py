"""The layout in docs/development.md names every module and folder of the tree, so it cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("artifacts", "registry", "engine", "benchmarks")


def _layout() -> str:
    text = (REPO / "docs" / "development.md").read_text()
    return re.search(r"```\n(.*?)```", text, re.S).group(1)  # the first code block is the tree


def test_every_module_is_named_in_the_layout():
    layout = _layout()
    words = set(re.findall(r"[\w.]+", layout))
    missing = [
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if path.name not in ("__init__.py", "__main__.py") and path.name not in words and path.stem not in words
    ]
    assert not missing, "docs/development.md's layout does not name: " + ", ".join(missing)


def test_every_subpackage_is_named_in_the_layout():
    layout = _layout()
    folders = [
        str(p.parent.relative_to(REPO))
        for package in PACKAGES
        for p in sorted((REPO / package).rglob("__init__.py"))
        if p.parent != REPO / package
    ]
    missing = [f for f in folders if f"{Path(f).name}/" not in layout]
    assert not missing, "docs/development.md's layout does not name the folders: " + ", ".join(missing)
