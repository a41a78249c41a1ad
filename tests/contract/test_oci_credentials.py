"""Logins, TLS and plain HTTP on the OCI backend, against docker-registry with htpasswd over TLS: a
login from config.json, a credential helper or the environment works; a wrong password, no
login, an unknown CA, plain HTTP to a TLS server and a registry that is down each raise
RegistryUnavailable naming the registry and the fix, never a miss."""

from __future__ import annotations

import json
import os
import re
import stat
import uuid

import pytest

from prebake.artifacts.ports.errors import RegistryUnavailable
from prebake.registry.oci import OCIRegistry
from prebake.registry.oci.address import OCISettings
from tests.support.bundles import make_bundle
from tests.support.oci_server import write_docker_config
from tests.support.ports import free_port

KEY = "0" * 64


def _address(oci) -> str:
    return oci.address(f"team/creds-{uuid.uuid4().hex[:8]}")


def test_the_login_docker_login_wrote_is_used(oci, tmp_path):
    b = make_bundle(tmp_path)
    registry = OCIRegistry(_address(oci))
    assert registry.publish(b.manifest, b.blob).created
    assert registry.lookup("graphs", b.manifest.key_digest) == b.manifest


def test_a_wrong_password_names_the_registry_the_login_source_and_the_fix(oci, tmp_path, monkeypatch):
    write_docker_config(tmp_path / "wrong", oci.host, "ci", "not-the-password")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "wrong"))

    with pytest.raises(
        RegistryUnavailable, match=r"refused the login .*config.json.*docker login 127\.0\.0\.1"
    ) as raised:
        OCIRegistry(_address(oci)).lookup("graphs", KEY)
    assert oci.host in str(raised.value)


def test_no_login_at_all_says_where_it_looked_and_how_to_log_in(oci, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "empty"))

    with pytest.raises(RegistryUnavailable, match=r"wants a login and none was found .*docker login"):
        OCIRegistry(_address(oci)).lookup("graphs", KEY)


def test_a_login_in_the_environment_wins_over_config_json(oci, tmp_path, monkeypatch):
    write_docker_config(tmp_path / "wrong", oci.host, "ci", "not-the-password")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "wrong"))
    monkeypatch.setenv("PREBAKE_OCI_USERNAME", "ci")
    monkeypatch.setenv("PREBAKE_OCI_PASSWORD", "contract-password")

    assert OCIRegistry(_address(oci)).lookup("graphs", KEY) is None  # a miss: reached and answered


def test_a_credential_helper_named_in_config_json_is_asked(oci, tmp_path, monkeypatch):
    """A real docker-credential-<name> program on PATH, speaking the helper protocol (stdin: the host)."""
    bin_dir, asked = tmp_path / "bin", tmp_path / "asked"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-prebaketest"
    helper.write_text(
        "#!/bin/sh\n"
        f'read host; echo "$1 $host" >> {asked}\n'
        'printf \'{"ServerURL":"%s","Username":"ci","Secret":"contract-password"}\' "$host"\n'
    )
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    config = tmp_path / "helper"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"credHelpers": {oci.host: "prebaketest"}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    assert OCIRegistry(_address(oci)).lookup("graphs", KEY) is None
    assert asked.read_text().split() == ["get", oci.host]


def test_a_registry_whose_ca_is_not_trusted_is_a_tls_error_naming_the_ca_setting(oci, monkeypatch):
    monkeypatch.delenv("PREBAKE_OCI_CA_BUNDLE")

    with pytest.raises(RegistryUnavailable, match=r"TLS with 127\.0\.0\.1:\d+ failed.*PREBAKE_OCI_CA_BUNDLE"):
        OCIRegistry(_address(oci)).lookup("graphs", KEY)


def test_plain_http_to_a_tls_registry_is_an_error_not_a_miss(oci, monkeypatch):
    monkeypatch.setenv("PREBAKE_OCI_PLAIN_HTTP", oci.host)

    with pytest.raises(RegistryUnavailable, match=re.escape(oci.host)):
        OCIRegistry(_address(oci), OCISettings(max_attempts=1, plain_http=(oci.host,))).lookup("graphs", KEY)


def test_a_registry_that_is_down_is_named_with_what_to_check(monkeypatch):
    host = f"127.0.0.1:{free_port()}"
    registry = OCIRegistry(f"oci://{host}/team/x", OCISettings(max_attempts=2, timeout_s=2, plain_http=(host,)))

    with pytest.raises(RegistryUnavailable, match=re.escape(host) + ".*did not answer.*check that it runs"):
        registry.lookup("graphs", KEY)


def test_https_is_the_default_and_plain_http_only_for_named_hosts(monkeypatch):
    monkeypatch.setenv("PREBAKE_OCI_PLAIN_HTTP", "127.0.0.1:5000")
    assert OCIRegistry("oci://127.0.0.1:5000/a/b").client.base == "http://127.0.0.1:5000"
    assert OCIRegistry("oci://127.0.0.1:5001/a/b").client.base == "https://127.0.0.1:5001"
    assert OCIRegistry("oci://ghcr.io/a/b").client.base == "https://ghcr.io"


def test_a_missing_ca_bundle_file_is_refused_up_front(monkeypatch, tmp_path):
    from prebake.artifacts.ports.errors import RegistryError

    monkeypatch.setenv("PREBAKE_OCI_CA_BUNDLE", str(tmp_path / "nope.pem"))
    with pytest.raises(RegistryError, match="PREBAKE_OCI_CA_BUNDLE=.*is not a file"):
        OCISettings.from_env()


# -- bearer tokens (how GHCR, ECR, Harbor, Quay and Docker Hub authenticate) ----------------------


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    from tests.support.oci_server import oci_available, oci_server
    from tests.support.oci_token import token_service

    if not oci_available():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    root = tmp_path_factory.mktemp("oci-token")
    with token_service({"ci": "token-password"}, root / "tokens") as tokens:
        with oci_server(root / "server", tls=True, token=tokens) as server:
            yield server, tokens


@pytest.fixture
def bearer(token_registry, monkeypatch, tmp_path):
    server, tokens = token_registry
    for name in ("PREBAKE_OCI_PLAIN_HTTP", "PREBAKE_OCI_USERNAME", "PREBAKE_OCI_PASSWORD", "REGISTRY_AUTH_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env(docker_config=tmp_path / "docker").items():
        monkeypatch.setenv(name, value)
    tokens.expire_next, tokens.refused = 0, 0
    tokens.issued.clear()
    return server, tokens


def test_the_bearer_challenge_is_answered_with_a_token_for_the_repository_scope(bearer, tmp_path):
    server, tokens = bearer
    address = _address(server)
    b = make_bundle(tmp_path)
    registry = OCIRegistry(address)

    assert registry.publish(b.manifest, b.blob).created
    assert OCIRegistry(address).lookup("graphs", b.manifest.key_digest) == b.manifest

    repo = address.split("/", 3)[3]
    assert f"repository:{repo}:pull,push" in tokens.issued and f"repository:{repo}:pull" in tokens.issued
    assert len(tokens.issued) <= 4, "a token is kept per scope, not fetched per request"


def test_an_expired_token_is_replaced_once_and_the_request_goes_through(bearer):
    server, tokens = bearer
    tokens.expire_next = 1

    assert OCIRegistry(_address(server)).lookup("graphs", KEY) is None
    assert len(tokens.issued) == 2


def test_tokens_that_keep_being_refused_are_an_error_naming_the_fix(bearer):
    server, tokens = bearer
    tokens.expire_next = 10

    with pytest.raises(RegistryUnavailable, match=r"refused the login .*wrong or expired.*docker login"):
        OCIRegistry(_address(server)).lookup("graphs", KEY)


def test_a_wrong_password_at_the_token_service_names_it_and_the_fix(bearer, tmp_path, monkeypatch):
    server, tokens = bearer
    write_docker_config(tmp_path / "wrong", server.host, "ci", "not-the-password")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "wrong"))

    with pytest.raises(
        RegistryUnavailable, match=r"token service http://127\.0\.0\.1:\d+/token refused .*docker login"
    ):
        OCIRegistry(_address(server)).lookup("graphs", KEY)
    assert tokens.refused == 1
