"""Where bundles live: one small protocol and one small module per backend.

`open_registry` turns an address into a backend:

    /some/folder, file:///some/folder   FileRegistry (the embedded default lives in $PREBAKE_HOME/registry)
"""

from __future__ import annotations

from pathlib import Path

from .base import Published, Registry
from .errors import UnknownRegistryError


def open_registry(address: str | Path) -> Registry:
    """The backend for an address: a plain path or file:// URL."""
    text = str(address)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        raise UnknownRegistryError(
            f"registry {address!r} uses scheme {scheme!r}, which prebake does not know; "
            f"use a folder path or file://"
        )
    from .file import FileRegistry

    return FileRegistry(text)


__all__ = ["Published", "Registry", "open_registry"]
