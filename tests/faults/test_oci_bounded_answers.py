"""An OCI registry (or a server posing as one) whose answers never end: a tags page, an error body and a
token that go on for ever are refused once past their bound, before they are read whole (issue 32, point 4).
Debian's docker-registry behind the fault proxy, which sends the endless bodies (no Content-Length)."""

from __future__ import annotations

import time
import uuid

import pytest

from prebake.artifacts.ports.errors import RegistryError, RegistryUnavailable
from prebake.registry.oci.client import MAX_ANSWER_BYTES, MAX_ERROR_BYTES
from tests.faults.fault_proxy import Fault, fault_proxy

SOCKET_SLACK = 32 << 20  # what loopback's buffers may hold beyond what the client read before it hung up


@pytest.fixture
def through_proxy(origin, scenario, in_force, monkeypatch, tmp_path):
    """A repository holding one signed bundle, and the fault proxy in front of the registry."""
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    for name in ("PREBAKE_OCI_TIMEOUT_S", "PREBAKE_OCI_CA_BUNDLE", "PREBAKE_OCI_USERNAME", "DOCKER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PREBAKE_OCI_MAX_ATTEMPTS", "1")
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=16 << 10)
    repo = f"faults/bounded{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    with fault_proxy(origin.url) as proxy:
        host = proxy.url.removeprefix("http://")
        monkeypatch.setenv("PREBAKE_OCI_PLAIN_HTTP", host)
        yield proxy, OCIRegistry(f"oci://{host}/{repo}"), bundle


def test_an_endless_tags_page_is_refused_past_its_bound(through_proxy):
    proxy, registry, _bundle = through_proxy
    proxy.inject(Fault("GET", "/tags/list", "huge200"))
    started = time.monotonic()
    with pytest.raises(RegistryError, match=f"is over {MAX_ANSWER_BYTES} bytes; no registry answer needs that"):
        list(registry.list())
    assert time.monotonic() - started < 30
    assert proxy.bytes_sent("/tags/list") < MAX_ANSWER_BYTES + SOCKET_SLACK


def test_an_endless_error_body_is_read_only_as_far_as_its_message(through_proxy):
    proxy, registry, bundle = through_proxy
    proxy.inject(Fault("GET", "/manifests/", "huge500"))
    with pytest.raises(RegistryUnavailable, match="HTTP 500"):
        registry.lookup(bundle.manifest.kind, bundle.manifest.key_digest)
    assert proxy.bytes_sent("/manifests/") < MAX_ERROR_BYTES + SOCKET_SLACK


def test_an_endless_token_is_refused_past_its_bound(through_proxy, monkeypatch):
    proxy, _registry, bundle = through_proxy
    from prebake.registry.oci import OCIRegistry

    monkeypatch.setenv("PREBAKE_OCI_MAX_ATTEMPTS", "2")  # the first answers the challenge, the second asks the token
    registry = OCIRegistry(_registry.url)
    proxy.inject(Fault("*", "/v2/", "bearer401"))
    proxy.inject(Fault("GET", "/token", "huge200"))
    with pytest.raises(RegistryUnavailable, match=f"answered over {MAX_ANSWER_BYTES} bytes; no token needs that"):
        registry.lookup(bundle.manifest.kind, bundle.manifest.key_digest)
    assert proxy.bytes_sent("/token") < MAX_ANSWER_BYTES + SOCKET_SLACK
