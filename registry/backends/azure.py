"""The Azure Blob Storage backend: the registry layout in a container, through azure-storage-blob.

    az://<account>/<container>/<prefix>      the registry's objects under <prefix>/ in the container

The address names the storage account and the container, as Azure's own URLs do
(https://<account>.blob.core.windows.net/<container>/<prefix>). Credentials come as Azure users
have them, the first that is set: AZURE_STORAGE_CONNECTION_STRING (its BlobEndpoint also points at
Azurite or a sovereign cloud), AZURE_STORAGE_KEY (or AZURE_STORAGE_ACCOUNT_KEY) with the account
of the address, AZURE_STORAGE_SAS_TOKEN; none reads a public container anonymously. Index entries
are created with If-None-Match: * (upload_blob(overwrite=False)), which Azure honours everywhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prebake.artifacts.errors import BundleError
from prebake.artifacts.ports.errors import RegistryError, RegistryUnavailable
from prebake.artifacts.ports.objects import Stored
from prebake.registry.shared.faults import Answer, Hints, translate
from prebake.registry.shared.index import StoreRegistry
from prebake.registry.shared.transfer import env_settings

_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_CONTAINER = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_CREDENTIALS = "AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN"


@dataclass(frozen=True)
class AzureSettings:
    """How requests run: PREBAKE_AZURE_CONCURRENCY, _MAX_ATTEMPTS and _TIMEOUT_S (see `from_env`)."""

    concurrency: int = 8  # parallel block uploads and ranged reads per blob
    max_attempts: int = 5  # per request, with exponential backoff
    timeout_s: float = 30.0  # connect and read timeout of each request

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_attempts < 1 or self.timeout_s <= 0:
            raise RegistryError(f"{self}: concurrency, max_attempts and timeout_s must be positive")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> AzureSettings:
        return cls(**env_settings("PREBAKE_AZURE_", {"concurrency": int, "max_attempts": int, "timeout_s": float}, env))


class AzureStore:
    """The object-store port over one container (and a prefix in it)."""

    writable = True

    def __init__(self, address: str, settings: AzureSettings | None = None, env: Mapping[str, str] = os.environ):
        self.account, self.container, self.prefix = _parse_address(address)
        self.url = f"az://{self.account}/{self.container}/{self.prefix}".rstrip("/")
        self.settings = settings or AzureSettings.from_env(env)
        self._client = _container_client(self.account, self.container, self.settings, env)
        self.endpoint = self._client.url

    def head(self, key: str) -> Stored | None:
        with self._faults(f"read {self.url}/{key}"):
            try:
                props = self._blob(key).get_blob_properties()
            except _not_found() as exc:
                _only_blob_missing(exc)
                return None
        return Stored(key, int(props.size), _tag(props.etag, props.size))

    def get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        from azure.core.exceptions import HttpResponseError

        with self._faults(f"read {self.url}/{key}"):
            try:
                download = self._blob(key).download_blob(offset=0, length=limit + 1)
            except _not_found() as exc:
                _only_blob_missing(exc)
                return None
            except HttpResponseError as exc:
                if exc.status_code != 416:  # a range on an empty blob: it has no bytes
                    raise
                props = self._blob(key).get_blob_properties()
                return b"", _tag(props.etag, 0)
            data = download.readall()
        if len(data) > limit:
            raise BundleError(f"{self.url}/{key} is over {limit} bytes; no manifest or side file is: refusing it")
        return data, _tag(download.properties.etag, len(data))

    def read(self, key: str, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        length = None if last is None else last - first + 1
        with self._faults(f"download {self.url}/{key}"):
            yield from self._blob(key).download_blob(offset=first or None, length=length).chunks()

    def put(self, key: str, data: bytes | Path, *, create_only: bool = False) -> bool:
        from azure.core.exceptions import ResourceExistsError

        with self._faults(f"write {self.url}/{key}"):
            try:
                if isinstance(data, Path):
                    with data.open("rb") as f:
                        self._blob(key).upload_blob(
                            f, length=data.stat().st_size, overwrite=not create_only,
                            max_concurrency=self.settings.concurrency,
                        )  # fmt: skip
                else:
                    self._blob(key).upload_blob(data, overwrite=not create_only)
            except ResourceExistsError:
                if not create_only:
                    raise
                return False
        return True

    def delete(self, key: str) -> None:
        with self._faults(f"remove {self.url}/{key}"):
            try:
                self._blob(key).delete_blob()
            except _not_found() as exc:
                _only_blob_missing(exc)

    def list(self, prefix: str) -> Iterator[Stored]:
        strip = len(self._key(""))
        with self._faults(f"list {self.url}/{prefix}"):
            for props in self._client.list_blobs(name_starts_with=self._key(prefix)):
                yield Stored(props.name[strip:], int(props.size), _tag(props.etag, props.size))

    def _blob(self, key: str) -> Any:
        return self._client.get_blob_client(self._key(key))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @contextmanager
    def _faults(self, doing: str) -> Iterator[None]:
        """The SDK's exceptions as registry errors naming the account, the container and the fix."""
        from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError

        try:
            yield
        except RegistryError:
            raise
        except ClientAuthenticationError as exc:
            answer = Answer(0, str(getattr(exc, "error_code", None) or exc), refused=True)
            raise translate(answer, doing, self._hints) from exc
        except HttpResponseError as exc:
            code, status = str(getattr(exc, "error_code", "") or ""), int(exc.status_code or 0)
            missing = code == "ContainerNotFound" or (status == 404 and code != "BlobNotFound")
            answer = Answer(status, code, detail=f"HTTP {status}, {exc.message}", missing=missing)
            raise translate(answer, doing, self._hints) from exc
        except (AzureError, ConnectionError) as exc:
            raise RegistryUnavailable(
                f"cannot {doing}: Azure Blob Storage at {self.endpoint} did not answer after "
                f"{self.settings.max_attempts} attempts ({type(exc).__name__}); check that it is up and that "
                f"the network, any proxy and the connection string's BlobEndpoint point at it"
            ) from exc

    @property
    def _hints(self) -> Hints:
        return Hints(
            who=self.endpoint,
            refused=f"check the credentials ({_CREDENTIALS}) and their rights on container {self.container}",
            missing=f"container {self.container} does not exist in account {self.account} ({self.endpoint}); "
            f"create it (az storage container create --name {self.container} --account-name {self.account}) "
            f"or fix the registry address",
            attempts=self.settings.max_attempts,
        )


class AzureRegistry(StoreRegistry):
    """index/ + blobs/ under az://account/container/prefix (prebake.registry.shared.index over AzureStore)."""

    def __init__(self, address: str, settings: AzureSettings | None = None):
        store = AzureStore(address, settings)
        super().__init__(store, readers=store.settings.concurrency)


def _parse_address(address: str) -> tuple[str, str, str]:
    account, _, rest = address.removeprefix("az://").partition("/")
    container, _, prefix = rest.partition("/")
    if not address.startswith("az://") or not _ACCOUNT.match(account):
        raise RegistryError(f"{address!r} names no storage account (3-24 lower-case letters and digits); "
                            f"write az://<account>/<container>/<prefix>")  # fmt: skip
    if not _CONTAINER.match(container):
        raise RegistryError(f"{address!r} names no valid container (3-63 lower-case letters, digits and single "
                            f"hyphens); write az://<account>/<container>/<prefix>")  # fmt: skip
    return account, container, prefix.strip("/")


def _container_client(account: str, container: str, settings: AzureSettings, env: Mapping[str, str]) -> Any:
    from azure.storage.blob import BlobServiceClient, ExponentialRetry

    options: dict[str, Any] = {
        "retry_policy": ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=settings.max_attempts - 1),
        "connection_timeout": settings.timeout_s,
        "read_timeout": settings.timeout_s,
    }
    key = env.get("AZURE_STORAGE_KEY") or env.get("AZURE_STORAGE_ACCOUNT_KEY")
    try:
        if conn := env.get("AZURE_STORAGE_CONNECTION_STRING"):
            service = BlobServiceClient.from_connection_string(conn, **options)
            if service.account_name != account:
                raise RegistryError(
                    f"AZURE_STORAGE_CONNECTION_STRING is for account {service.account_name}, but the registry address "
                    f"names {account}; set the connection string of {account}, or fix the address"
                )
        else:
            credential: Any = (
                {"account_name": account, "account_key": key} if key else env.get("AZURE_STORAGE_SAS_TOKEN")
            )
            service = BlobServiceClient(f"https://{account}.blob.core.windows.net", credential=credential, **options)
    except ValueError as exc:
        raise RegistryError(f"cannot set up the Azure client: {exc}; check {_CREDENTIALS}") from exc
    return service.get_container_client(container)


def _not_found() -> type[Exception]:
    from azure.core.exceptions import ResourceNotFoundError

    return ResourceNotFoundError


def _only_blob_missing(exc: Exception) -> None:
    """A missing blob is a miss; a missing container is raised again, for `_faults` to name."""
    if getattr(exc, "error_code", None) == "ContainerNotFound":
        raise exc


def _tag(etag: str | None, size: int) -> str:
    return f"{(etag or '').strip(chr(34))}/{size}"
