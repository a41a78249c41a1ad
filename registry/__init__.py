"""Where bundles live: `open_registry` turns an address into a registry (backends/, oci/, chain.py).

    /some/folder                             FileRegistry (the embedded default: $PREBAKE_HOME/registry)
    <scheme>...                              the backend of its row in registry/schemes.py's BACKENDS
    /local/folder,<address>                  ChainRegistry: nearest first (registry/address.py)

An address that names nothing is RegistryNotFound, unless `create` is set (only the commands
that write). Backends import boto3, huggingface_hub, httpx or azure only when opened, so
`import prebake.registry` stays light; an address whose extra is missing says which in one line.
The table of addresses and what each backend needs: docs/registries.md.
"""

from __future__ import annotations

from pathlib import Path

from prebake.artifacts.extras import require
from prebake.artifacts.ports.errors import RegistryNotFound, UnknownRegistryError
from prebake.artifacts.ports.registry import Registry
from prebake.registry.address import split_addresses
from prebake.registry.schemes import FOLDER, SCHEMES, Opening, backend_of


def open_registry(address: str | Path, *, create: bool = True, home: Path | None = None) -> Registry:
    """The backend for an address; a comma-separated list of addresses opens a chain, nearest first.

    create=False: a folder that does not exist raises RegistryNotFound (so does a missing bucket,
    Hub repo or OCI repository, when first asked) instead of reading as an empty registry.
    home: the store's folder, where a Hub registry keeps its listing summaries (home/listing).
    """
    if isinstance(address, Path):
        from prebake.registry.backends.file import FileRegistry

        return FileRegistry(address, create=create)
    parts = split_addresses(str(address))
    if not parts:
        raise UnknownRegistryError(
            f"registry address {address!r} is empty; name a folder or one of {', '.join(SCHEMES)}"
        )
    if len(parts) > 1:
        from prebake.registry.chain import ChainRegistry

        # Only the nearest member is written (publish, backfill creates nothing far away).
        return ChainRegistry(
            [_open_one(part, create=create and i == 0, listed=parts, home=home) for i, part in enumerate(parts)]
        )
    return _open_one(parts[0], create=create, home=home)


def _open_one(text: str, *, create: bool, listed: list[str] | None = None, home: Path | None = None) -> Registry:
    backend = backend_of(text)
    if backend is None:
        scheme = text.split("://", 1)[0]
        raise UnknownRegistryError(
            f"registry {text!r} uses scheme {scheme!r}, which prebake does not know; "
            f"use a folder path or one of {', '.join(SCHEMES)}"
        )
    if backend.extra is not None:
        require(backend.extra, f"an {backend.scheme} registry")
    try:
        return backend.open(text, Opening(create=create, home=home))
    except RegistryNotFound as exc:
        if backend is FOLDER and listed and len(listed) > 1:
            exc.add_note(
                f"the address was read as a chain of {len(listed)} registries ({' | '.join(listed)}); if a comma "
                f"is part of a folder's name, write it as \\, or pass one --registry per address"
            )
        raise


__all__ = ["open_registry"]
