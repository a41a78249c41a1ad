"""An OCI registry that is rate limiting: a 429 or 503 with Retry-After is waited for as long as it asks
(issue 32, point 4), then the fetch completes; before, the client retried after its own ~0.1 s backoff.
Debian's docker-registry behind the fault proxy, which answers the first blob GET with the refusal."""

from __future__ import annotations

import uuid

import pytest

from prebake.artifacts.store.local import Installed
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import unbounded

ASKED_S = 2.0


@pytest.mark.parametrize("status", [429, 503])
def test_a_registry_asking_to_retry_after_two_seconds_is_waited_for_then_read(
    tmp_path, origin, scenario, in_force, monkeypatch, status
):
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    for name in ("PREBAKE_OCI_MAX_ATTEMPTS", "PREBAKE_OCI_TIMEOUT_S", "PREBAKE_OCI_CA_BUNDLE", "DOCKER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=64 << 10)
    repo = f"faults/retry{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    store = unbounded(scenario.store(tmp_path / "home"))
    with fault_proxy(origin.url) as proxy:
        host = proxy.url.removeprefix("http://")
        monkeypatch.setenv("PREBAKE_OCI_PLAIN_HTTP", host)
        proxy.inject(Fault("GET", "/blobs/sha256:", f"busy{status}", seconds=ASKED_S, times=1))
        got = in_force.fetch(store, OCIRegistry(f"oci://{host}/{repo}"), bundle.manifest.the_key())
        answered = proxy.answered_at("GET", "/blobs/sha256:")
        statuses = proxy.statuses("GET", "/blobs/sha256:")
    assert isinstance(got, Installed), got
    assert statuses[0] == status and statuses[-1] == 200, statuses
    waited = answered[1] - answered[0]
    assert waited >= ASKED_S - 0.05, f"asked to wait {ASKED_S} s, asked again after {waited:.2f} s"
    assert store_problems(store.home) == []
