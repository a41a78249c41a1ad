"""Where bundles live: `open_registry` turns an address into a registry (backends/, oci/, chain.py).

    /some/folder, file:///some/folder        FileRegistry (the embedded default: $PREBAKE_HOME/registry)
    s3://bucket/prefix, az://account/container/prefix      S3Registry, AzureRegistry
    hf://[datasets/]ns/repo[@rev]            HubRegistry: a Hugging Face model or dataset repo
    oci://host[:port]/namespace/repo, oci-layout:DIR|FILE.tar   OCIRegistry, LayoutRegistry
    /local/folder,s3://team/prebake          ChainRegistry: nearest first (registry/address.py)

An address that names nothing is RegistryNotFound, unless `create` is set (only the commands
that write). Backends import boto3, huggingface_hub, httpx or azure only when opened, so
`import prebake.registry` stays light; an address whose extra is missing says which in one line.
The table of addresses and what each backend needs: docs/registries.md.
"""

from __future__ import annotations

from pathlib import Path

from prebake.artifacts.extras import require
from prebake.artifacts.ports.errors import RegistryNotFound, UnknownRegistryError
from prebake.registry.address import split_addresses
from prebake.registry.shared.transfer import Published, Registry

SCHEMES = ("file://", "s3://", "hf://", "oci://", "az://", "oci-layout:")
EXTRA_OF_SCHEME = {
    "s3://": "s3",
    "hf://": "hf",
    "oci://": "oci",
    "az://": "azure",
    "oci-layout:": "oci",  # registry/oci/ (the package the layout lives in) imports httpx
}  # the wheel's extra each backend needs


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
    _require_extra(text)
    if text.startswith("s3://"):
        from prebake.registry.backends.s3 import S3Registry

        return S3Registry(text)
    if text.startswith("hf://"):
        from prebake.registry.backends.hf import HubRegistry

        return HubRegistry(text, must_exist=not create, listing_dir=None if home is None else home / "listing")
    if text.startswith("oci://"):
        from prebake.registry.oci import OCIRegistry

        return OCIRegistry(text, must_exist=not create)
    if text.startswith("az://"):
        from prebake.registry.backends.azure import AzureRegistry

        return AzureRegistry(text)
    if text.startswith("oci-layout:"):
        from prebake.registry.oci.layout import LayoutRegistry

        return LayoutRegistry(text, create=create)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        raise UnknownRegistryError(
            f"registry {text!r} uses scheme {scheme!r}, which prebake does not know; "
            f"use a folder path or one of {', '.join(SCHEMES)}"
        )
    from prebake.registry.backends.file import FileRegistry

    try:
        return FileRegistry(text, create=create)
    except RegistryNotFound as exc:
        if listed and len(listed) > 1:
            exc.add_note(
                f"the address was read as a chain of {len(listed)} registries ({' | '.join(listed)}); if a comma "
                f"is part of a folder's name, write it as \\, or pass one --registry per address"
            )
        raise


def _require_extra(address: str) -> None:
    """One line naming the extra to install when the backend of `address` needs one that is missing."""
    for scheme, extra in EXTRA_OF_SCHEME.items():
        if address.startswith(scheme):
            require(extra, f"an {scheme} registry")


__all__ = ["SCHEMES", "Published", "Registry", "open_registry"]
