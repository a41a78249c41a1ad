"""An OCI registry's credentials over a fetch, as Docker's clients keep them (issue 32, point 4):

- a blob GET the registry redirects to another host (distribution and Harbor send blob GETs to
  object storage) reaches that host without the registry's login;
- a bearer token the registry stops taking in the middle of a ranged fetch (it expired) is renewed
  at the token service and the fetch goes on: one more token, no failure.

Debian's docker-registry behind the fault proxy; the second case with a real token service
(tests/support/oci_token.py) whose JWTs the registry verifies.
"""

from __future__ import annotations

import uuid

import pytest

from prebake.artifacts.store.local import Installed
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import unbounded

USER, PASSWORD = "ci", "token-password"


@pytest.fixture
def login(monkeypatch):
    """The login every request of the client may carry, from the variables a CI job sets."""
    for name in ("PREBAKE_OCI_MAX_ATTEMPTS", "PREBAKE_OCI_CA_BUNDLE", "DOCKER_CONFIG", "REGISTRY_AUTH_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PREBAKE_OCI_USERNAME", USER)
    monkeypatch.setenv("PREBAKE_OCI_PASSWORD", PASSWORD)


def test_a_blob_redirected_to_another_host_reaches_it_without_the_registrys_login(
    tmp_path, origin, scenario, in_force, login
):
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=64 << 10)
    repo = f"faults/redirect{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    store = unbounded(scenario.store(tmp_path / "home"))
    with fault_proxy(origin.url) as storage, fault_proxy(origin.url) as front:
        host = front.url.removeprefix("http://")
        front.inject(Fault("GET", "/blobs/sha256:", "redirect", to=storage.url))  # the blob lives elsewhere
        front.inject(Fault("*", "/v2/", "basic401"))  # the registry wants the login on every request
        registry = OCIRegistry(f"oci://{host}/{repo}", OCISettings(plain_http=(host,)))
        got = in_force.fetch(store, registry, bundle.manifest.the_key())
        at_registry = front.credentials("GET", "/manifests/")
        redirected = front.statuses("GET", "/blobs/sha256:")
        at_storage = storage.credentials("GET", "/blobs/sha256:")
    assert isinstance(got, Installed), got
    assert any(c.startswith("Basic ") for c in at_registry), f"the login was never sent: {at_registry}"
    assert redirected and set(redirected) == {307}, redirected
    assert at_storage, "the redirect was not followed"
    assert at_storage == [""] * len(at_storage), f"the registry's login reached the storage host: {at_storage}"
    assert store_problems(store.home) == []


@pytest.fixture(scope="module")
def token_origin(tmp_path_factory):
    """docker-registry in token mode (plain HTTP) and the token service it trusts."""
    from tests.support.oci_server import oci_available, oci_server
    from tests.support.oci_token import token_service

    if not oci_available():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    root = tmp_path_factory.mktemp("oci-token")
    with token_service({USER: PASSWORD}, root / "tokens") as tokens:
        with oci_server(root / "server", token=tokens) as server:
            yield server, tokens


def test_a_token_refused_as_expired_in_the_middle_of_a_ranged_fetch_is_renewed_and_the_fetch_completes(
    tmp_path, token_origin, scenario, in_force, login
):
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    server, tokens = token_origin
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=3 << 20)  # 3 MiB: ranged parts of 1 MiB
    repo = f"faults/expiry{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(server.address(repo), OCISettings(plain_http=(server.host,), settle_s=0.1))
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    store = unbounded(scenario.store(tmp_path / "home"))
    with fault_proxy(server.url) as proxy:
        host = proxy.url.removeprefix("http://")
        # the second part's GET: the registry answers it as it answers an expired token
        proxy.inject(Fault("GET", "/blobs/sha256:", "expired401", after=1, times=1))
        registry = OCIRegistry(f"oci://{host}/{repo}", OCISettings(plain_http=(host,), chunk_mb=1, parts=1))
        issued = len(tokens.issued)
        got = in_force.fetch(store, registry, bundle.manifest.the_key())
        statuses = proxy.statuses("GET", "/blobs/sha256:")
        sent = proxy.credentials("GET", "/blobs/sha256:")
    assert isinstance(got, Installed), got
    assert statuses[0] == 206 and statuses[1] == 401 and set(statuses[2:]) == {206}, statuses
    assert len(statuses) >= 4, f"not a ranged fetch of three parts or more: {statuses}"
    assert sent[1] != sent[2] and sent[2].startswith("Bearer "), "the part was asked again with a new token"
    assert len(tokens.issued) - issued == 2, "one token for the fetch, one more when the registry refused it"
    assert store_problems(store.home) == []
