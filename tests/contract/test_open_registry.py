"""open_registry: one address per scheme, a comma list for a chain, a clear refusal otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.ports.errors import UnknownRegistryError
from prebake.registry import open_registry
from prebake.registry.backends.file import FileRegistry
from prebake.registry.backends.hf import HubRegistry
from prebake.registry.backends.s3 import S3Registry
from prebake.registry.chain import ChainRegistry

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_folders_and_file_urls_open_the_file_backend(tmp_path):
    for address in (str(tmp_path), f"file://{tmp_path}", tmp_path):
        registry = open_registry(address)
        assert isinstance(registry, FileRegistry) and registry.root == tmp_path


def test_s3_addresses_open_the_s3_backend(s3_client):
    registry = open_registry("s3://team-bucket/prebake/v1/")

    assert isinstance(registry, S3Registry)
    assert (registry.s3.bucket, registry.s3.prefix, registry.url) == (
        "team-bucket",
        "prebake/v1",
        "s3://team-bucket/prebake/v1",
    )


@pytest.mark.parametrize(
    "address, repo_type, repo_id, revision",
    [
        ("hf://org/bundles", "model", "org/bundles", "main"),
        ("hf://org/bundles@v2", "model", "org/bundles", "v2"),
        ("hf://datasets/org/bundles", "dataset", "org/bundles", "main"),
        ("hf://datasets/org/bundles@" + "a" * 40, "dataset", "org/bundles", "a" * 40),
    ],
)
def test_hub_addresses_open_the_hub_backend(hub, address, repo_type, repo_id, revision):
    registry = open_registry(address)

    assert isinstance(registry, HubRegistry)
    assert (registry.repo_type, registry.repo_id, registry.revision) == (repo_type, repo_id, revision)
    assert registry.endpoint == hub.url, "HF_ENDPOINT is read when the registry is opened"


def test_a_comma_list_opens_a_chain_nearest_first(hub, s3_client, tmp_path):
    chain = open_registry(f"{tmp_path}, s3://team-bucket/prebake ,hf://org/bundles")

    assert isinstance(chain, ChainRegistry)
    assert [type(r) for r in chain.registries] == [FileRegistry, S3Registry, HubRegistry]


@pytest.mark.parametrize("address", ["gs://bucket/prefix", "https://example.com/registry"])
def test_an_unknown_scheme_is_refused_naming_the_known_ones(address):
    with pytest.raises(UnknownRegistryError, match=r"file://, s3://, hf://"):
        open_registry(address)


def test_an_empty_address_is_refused():
    with pytest.raises(UnknownRegistryError, match="empty"):
        open_registry(" , ")


def test_importing_registry_loads_neither_boto3_nor_huggingface_hub():
    code = (
        "import sys; import prebake.registry as registry; registry.open_registry('/tmp/x'); "
        "print(sorted(m for m in ('boto3', 'huggingface_hub') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)

    assert out.stdout.strip() == "[]"
