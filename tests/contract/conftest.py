"""Fixtures of the registry contract suite: one `backend` per registry kind, on real servers.

S3 runs against moto's server mode started as a separate process on loopback (one per test
session, a fresh bucket per test); the Hub runs against tests/support/hub_server.py, a small
HTTP server speaking the endpoints huggingface_hub calls (one per session, a fresh repo per
test); OCI runs against Debian's docker-registry (distribution 2.8) with htpasswd auth over TLS
with a CA the session makes (tests/support/oci_server.py; one per session, a fresh repository
per test, the login in a Docker config.json); Azure runs against Azurite, Microsoft's emulator
(tests/support/azurite_server.py; one per session, a fresh container per test). Each backend comes with a way to corrupt a stored blob through its own storage.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from prebake.artifacts.layout import blob_relpath
from prebake.artifacts.ports.registry import Registry
from prebake.registry.backends.file import FileRegistry
from prebake.registry.chain import ChainRegistry
from tests.support.azurite_server import Azurite, azurite_available, azurite_server
from tests.support.bundles import Bundle, make_bundle
from tests.support.hub_server import HubStandIn, hub_server
from tests.support.moto_server import moto_server, s3_env
from tests.support.oci_server import OCIServer, oci_available, oci_server
from tests.support.ports import free_port

S3_PREFIX = "team/prebake"


@dataclass
class Backend:
    """A registry under test, plus what the tests need to reach around it."""

    name: str
    registry: Registry
    corrupt_blob: Callable[[str, bytes], None]  # (blob digest, bytes): replace the stored blob's bytes
    second_client: Callable[[], Registry]  # another, independent client of the same storage


# -- servers ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_client(s3_endpoint, monkeypatch):
    """A boto3 client of the moto server; the environment points every S3 client at it."""
    import boto3

    for name, value in s3_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return boto3.client("s3")


@pytest.fixture
def s3_bucket(s3_client) -> str:
    name = f"prebake-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def hub_server_session() -> Iterator[HubStandIn]:
    with hub_server() as hub:
        yield hub


@pytest.fixture
def hub(hub_server_session, monkeypatch, tmp_path) -> Iterator[HubStandIn]:
    """The Hub stand-in, with HF_ENDPOINT, HF_TOKEN and a private HF_HUB_CACHE for this test."""
    monkeypatch.setenv("HF_ENDPOINT", hub_server_session.url)
    monkeypatch.setenv("HF_TOKEN", "hf_contract_token")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield hub_server_session
    hub_server_session.on_commit = None


@pytest.fixture(scope="session")
def hub_lfs_session() -> Iterator[HubStandIn]:
    with hub_server(lfs=True) as hub:
        yield hub


@pytest.fixture
def hub_lfs(hub_lfs_session, monkeypatch, tmp_path) -> Iterator[HubStandIn]:
    """The Hub stand-in that stores blobs through the LFS batch API; Xet off, as the stand-in has none."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)  # what HF_HUB_DISABLE_XET=1 sets
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # and for child processes
    monkeypatch.setenv("HF_ENDPOINT", hub_lfs_session.url)
    monkeypatch.setenv("HF_TOKEN", "hf_contract_token")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield hub_lfs_session


@pytest.fixture(scope="session")
def oci_session(tmp_path_factory) -> Iterator[OCIServer]:
    if not oci_available():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    with oci_server(tmp_path_factory.mktemp("oci"), tls=True, users={"ci": "contract-password"}) as server:
        yield server


@pytest.fixture
def oci(oci_session, monkeypatch, tmp_path) -> OCIServer:
    """The TLS + htpasswd registry, with its CA and a Docker config.json holding the login in the environment."""
    for name in ("PREBAKE_OCI_PLAIN_HTTP", "PREBAKE_OCI_USERNAME", "PREBAKE_OCI_PASSWORD", "REGISTRY_AUTH_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in oci_session.env(docker_config=tmp_path / "docker").items():
        monkeypatch.setenv(name, value)
    return oci_session


@pytest.fixture(scope="session")
def azurite_session(tmp_path_factory) -> Iterator[Azurite]:
    if not azurite_available():
        pytest.skip("azurite is not installed (npm install -g azurite; .ci/run does)")
    with azurite_server(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture
def azurite(azurite_session, monkeypatch) -> Azurite:
    """Azurite, with its connection string in the environment and no other Azure credentials."""
    for name in ("AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in azurite_session.env().items():
        monkeypatch.setenv(name, value)
    return azurite_session


@pytest.fixture
def bundle(tmp_path) -> Callable[..., Bundle]:
    """make_bundle(...) writing under this test's tmp_path."""
    return lambda **kw: make_bundle(tmp_path, **kw)


# -- backends --------------------------------------------------------------------------------


def _file(request, tmp_path: Path) -> Backend:
    root = tmp_path / "registry"
    registry = FileRegistry(root)

    def corrupt(digest: str, data: bytes) -> None:
        registry.blob_path(digest).write_bytes(data)

    return Backend("file", registry, corrupt, lambda: FileRegistry(root))


def _s3(request, tmp_path: Path, *, conditional: bool = True) -> Backend:
    from prebake.registry.backends.s3 import S3Registry
    from prebake.registry.backends.s3_client import S3Settings

    bucket, client = request.getfixturevalue("s3_bucket"), request.getfixturevalue("s3_client")
    address, settings = f"s3://{bucket}/{S3_PREFIX}", S3Settings(conditional_put=conditional)

    def corrupt(digest: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"{S3_PREFIX}/{blob_relpath(digest)}", Body=data)

    name = "s3" if conditional else "s3-unconditional"
    return Backend(name, S3Registry(address, settings), corrupt, lambda: S3Registry(address, settings))


def _hf(request, tmp_path: Path) -> Backend:
    from prebake.registry.backends.hf import HubRegistry

    hub = request.getfixturevalue("hub")
    repo = f"team/registry-{uuid.uuid4().hex[:8]}"

    def corrupt(digest: str, data: bytes) -> None:
        hub.overwrite("model", repo, blob_relpath(digest), data)

    second = lambda: HubRegistry(f"hf://{repo}", cache_dir=tmp_path / "hf-cache-second")  # noqa: E731
    return Backend("hf", HubRegistry(f"hf://{repo}"), corrupt, second)


def _hf_lfs(request, tmp_path: Path) -> Backend:
    """The Hub backend with blobs going through Git LFS (upload: batch + basic PUT + verify)."""
    from prebake.registry.backends.hf import HubRegistry

    hub = request.getfixturevalue("hub_lfs")
    repo = f"team/registry-{uuid.uuid4().hex[:8]}"

    def corrupt(digest: str, data: bytes) -> None:
        hub.overwrite("model", repo, blob_relpath(digest), data)

    second = lambda: HubRegistry(f"hf://{repo}", cache_dir=tmp_path / "hf-cache-second")  # noqa: E731
    return Backend("hf-lfs", HubRegistry(f"hf://{repo}"), corrupt, second)


def _chain(request, tmp_path: Path) -> Backend:
    near, far = _file(request, tmp_path), _s3(request, tmp_path)
    make = lambda: ChainRegistry([FileRegistry(tmp_path / "registry"), far.second_client()])  # noqa: E731
    return Backend("chain", ChainRegistry([near.registry, far.registry]), near.corrupt_blob, make)


def _oci(request, tmp_path: Path) -> Backend:
    from prebake.registry.oci import OCIRegistry

    server = request.getfixturevalue("oci")
    address = server.address(f"team/registry-{uuid.uuid4().hex[:8]}")

    def corrupt(digest: str, data: bytes) -> None:
        server.blob_file(digest).write_bytes(data)

    return Backend("oci", OCIRegistry(address), corrupt, lambda: OCIRegistry(address))


def _azure(request, tmp_path: Path) -> Backend:
    from azure.storage.blob import BlobServiceClient

    from prebake.registry.backends.azure import AzureRegistry

    server = request.getfixturevalue("azurite")
    container = f"prebake-{uuid.uuid4().hex[:12]}"
    client = BlobServiceClient.from_connection_string(server.connection_string()).get_container_client(container)
    client.create_container()
    address = server.address(f"{container}/{S3_PREFIX}")

    def corrupt(digest: str, data: bytes) -> None:
        client.upload_blob(f"{S3_PREFIX}/{blob_relpath(digest)}", data, overwrite=True)

    return Backend("azure", AzureRegistry(address), corrupt, lambda: AzureRegistry(address))


BACKENDS = {
    "file": _file,
    "s3": _s3,
    "s3-unconditional": lambda request, tmp_path: _s3(request, tmp_path, conditional=False),
    "hf": _hf,
    "hf-lfs": _hf_lfs,
    "chain": _chain,
    "oci": _oci,
    "azure": _azure,
}


@pytest.fixture(params=list(BACKENDS))
def backend(request, tmp_path) -> Backend:
    return BACKENDS[request.param](request, tmp_path)


# -- registries nobody answers for ---------------------------------------------------------------


def _s3_down(request, tmp_path: Path, monkeypatch) -> Registry:
    from prebake.registry.backends.s3 import S3Registry
    from prebake.registry.backends.s3_client import S3Settings

    request.getfixturevalue("s3_client")  # the dummy credentials and no profile files
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    return S3Registry("s3://prebake-down/team", S3Settings(max_attempts=2, timeout_s=2))


def _hf_down(request, tmp_path: Path, monkeypatch) -> Registry:
    from prebake.registry.backends.hf import HubRegistry

    request.getfixturevalue("hub")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    return HubRegistry("hf://team/down")


def _chain_down(request, tmp_path: Path, monkeypatch) -> Registry:
    return ChainRegistry([FileRegistry(tmp_path / "near"), _s3_down(request, tmp_path, monkeypatch)])


def _oci_down(request, tmp_path: Path, monkeypatch) -> Registry:
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    host = f"127.0.0.1:{free_port()}"
    return OCIRegistry(f"oci://{host}/team/down", OCISettings(max_attempts=2, timeout_s=2, plain_http=(host,)))


def _azure_down(request, tmp_path: Path, monkeypatch) -> Registry:
    from prebake.registry.backends.azure import AzureRegistry, AzureSettings

    nobody = Azurite(f"http://127.0.0.1:{free_port()}/devstoreaccount1")  # Azurite's account, nobody at its port
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", nobody.connection_string())
    return AzureRegistry(nobody.address("down/team"), AzureSettings(max_attempts=2, timeout_s=2))


DOWN = {"s3": _s3_down, "hf": _hf_down, "chain": _chain_down, "oci": _oci_down, "azure": _azure_down}


@pytest.fixture(params=list(DOWN))
def down_registry(request, tmp_path, monkeypatch) -> Registry:
    return DOWN[request.param](request, tmp_path, monkeypatch)
