"""Where bundles live: one small protocol and one small module per backend.

`open_registry` turns an address into a backend:

    /some/folder, file:///some/folder        FileRegistry (the embedded default lives in $PREBAKE_HOME/registry)
    s3://bucket/prefix                       S3Registry: AWS, MinIO, R2, Ceph (standard AWS configuration)
    hf://ns/repo[@rev]                       HubRegistry: a Hugging Face model repo
    hf://datasets/ns/repo[@rev]              HubRegistry: a dataset repo
    /local/folder,s3://team/prebake          ChainRegistry: nearest first, farther hits backfilled

Backends import boto3 or huggingface_hub only when opened, so `import prebake.registry` stays light.
"""

from __future__ import annotations

from pathlib import Path

from prebake.registry.base import Published, Registry
from prebake.registry.errors import UnknownRegistryError

SCHEMES = ("file://", "s3://", "hf://")


def open_registry(address: str | Path) -> Registry:
    """The backend for an address; a comma-separated list of addresses opens a chain, nearest first."""
    if isinstance(address, Path):
        from prebake.registry.file import FileRegistry

        return FileRegistry(address)
    parts = [part.strip() for part in str(address).split(",") if part.strip()]
    if not parts:
        raise UnknownRegistryError(
            f"registry address {address!r} is empty; name a folder or one of {', '.join(SCHEMES)}"
        )
    if len(parts) > 1:
        from prebake.registry.chain import ChainRegistry

        return ChainRegistry([_open_one(part) for part in parts])
    return _open_one(parts[0])


def _open_one(text: str) -> Registry:
    if text.startswith("s3://"):
        from prebake.registry.s3 import S3Registry

        return S3Registry(text)
    if text.startswith("hf://"):
        from prebake.registry.hf import HubRegistry

        return HubRegistry(text)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        raise UnknownRegistryError(
            f"registry {text!r} uses scheme {scheme!r}, which prebake does not know; "
            f"use a folder path or one of {', '.join(SCHEMES)}"
        )
    from prebake.registry.file import FileRegistry

    return FileRegistry(text)


__all__ = ["SCHEMES", "Published", "Registry", "open_registry"]
