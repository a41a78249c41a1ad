"""A fresh venv that holds only some of this environment's distributions, linked in file by file.

It stands for `pip install` into an empty venv without the network: the distributions a wheel
declares (and theirs, transitively, as their metadata declares them) are found installed here and
their files (as their RECORD lists them) linked into the new venv's site-packages, dist-info
included, so `pip check` judges the result. Anything not declared is absent, as it would be after
a real install: an undeclared import fails.
"""

from __future__ import annotations

import importlib.metadata as md
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(requirements: Iterable[str], extras: Iterable[str] = ()) -> dict[str, md.Distribution]:
    """The installed distributions `requirements` need, by canonical name, dependencies included;
    `extras`: those of the project whose requirements these are (its markers `extra == ...`).

    A requirement whose marker does not hold here (another platform, an extra not asked for) is left
    out; one that holds but is not installed here raises LookupError.
    """
    found: dict[str, md.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), frozenset(extras)) for r in requirements]
    while todo:
        requirement, asked = todo.pop()
        if requirement.marker is not None and not any(requirement.marker.evaluate({"extra": e}) for e in asked or {""}):
            continue
        name, extras = canonicalize_name(requirement.name), frozenset(requirement.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name not in found:
            try:
                found[name] = md.distribution(name)
            except md.PackageNotFoundError as exc:
                raise LookupError(
                    f"{requirement} is needed but not installed beside {sysconfig.get_paths()['purelib']}"
                ) from exc
        todo += [(Requirement(r), extras) for r in found[name].requires or ()]
    return found


def link_into(venv: Path, distributions: Iterable[md.Distribution]) -> int:
    """Link every file of `distributions` into the site-packages of `venv`; how many were linked."""
    purelib = Path(sysconfig.get_paths(vars={"base": venv, "platbase": venv})["purelib"])
    count = 0
    for dist in distributions:
        for file in dist.files or ():
            if ".." in file.parts or "__pycache__" in file.parts:  # scripts of bin/; bytecode is remade
                continue
            source = Path(str(dist.locate_file(file)))
            target = purelib / file
            if source.is_file() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(source)
                count += 1
    return count
