"""The store and the registries never share a folder.

The store evicts what its bound does not hold and removes what it does not recognise
(`prebake gc`, `store verify --fix`); a registry keeps every bundle ever published. A folder
registry that is the store's own folder, or lies inside it, or holds it, would have its index
entries and blobs deleted by the store's gc (they sit where the store keeps its own), and a
registry's maintenance would touch the store. So every folder of a registry address is checked
against PREBAKE_HOME when the address is chosen (`Store.registry_address`), on the real paths
(links followed), and refused with the fix. The one folder inside the store a registry may
use is the embedded default, $PREBAKE_HOME/registry, which the store never evicts.

Only folder addresses are checked (a path, file://path, or either inside a comma-separated
chain); s3:// and hf:// registries cannot overlap a local folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from prebake.artifacts.errors import StoreOverlapError

_REMOTE = ("s3://", "hf://")


def folder_parts(address: str) -> list[str]:
    """The folders a registry address names: every member of a chain that is not remote."""
    folders = []
    for part in (p.strip() for p in address.split(",")):
        if not part or part.startswith(_REMOTE):
            continue
        if part.startswith("file://"):
            part = part[len("file://") :]
        elif "://" in part:  # an unknown scheme: open_registry refuses it with its own message
            continue
        folders.append(part)
    return folders


def check_apart(home: Path, address: str, *, embedded: Path) -> None:
    """Raise StoreOverlapError if a folder of `address` is `home`, lies inside it (other than
    `embedded`, the default registry's own place), or holds it."""
    store = _real(home)
    allowed = _real(embedded)
    for folder in folder_parts(address):
        registry = _real(Path(folder))
        if registry == allowed:
            continue
        if registry == store:
            why = "is the store's own folder"
        elif _inside(registry, store):
            why = "lies inside the store's folder"
        elif _inside(store, registry):
            why = "holds the store's folder"
        else:
            continue
        raise StoreOverlapError(
            f"registry folder {folder} {why} ({home}, PREBAKE_HOME): the store's gc would delete the "
            f"registry's bundles; put the registry in a folder of its own (outside {home}), or leave "
            f"PREBAKE_REGISTRY unset to use the embedded one, {embedded}"
        )


def _real(path: Path) -> Path:
    return Path(os.path.realpath(os.path.abspath(path.expanduser())))


def _inside(path: Path, folder: Path) -> bool:
    return path != folder and path.is_relative_to(folder)
