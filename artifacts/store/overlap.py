"""The store and the registries never share a folder.

The store's gc would delete a folder registry's entries and blobs if the registry were the
store's folder, inside it, or held it. So every folder of a registry address (a path, file://,
or either in a chain) is checked against PREBAKE_HOME on the real paths when the address is
chosen (`Store.registry_address`), and refused with the fix; the one registry allowed inside is
the embedded default, $PREBAKE_HOME/registry, which the store never evicts. Remote addresses
cannot overlap a local folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from prebake.artifacts.errors import StoreOverlapError


def folder_parts(address: str) -> list[str]:
    """The folders a registry address names: every member of a chain that is not remote."""
    folders = []
    for part in (p.strip() for p in address.split(",")):
        if not part:
            continue
        if part.startswith("file://"):
            part = part[len("file://") :]
        elif "://" in part:  # a remote backend's address, or an unknown scheme open_registry refuses
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
