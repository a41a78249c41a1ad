"""An OCI registry that misbehaves: down, too slow, 500s, a connection cut mid-blob, short and wrong
bytes, failing uploads. The real client talks real HTTP to Debian's docker-registry through the
proxy that injects each fault (tests/faults/fault_proxy.py).

Reading: fetch raises a RegistryError subclass naming the registry and the fix, or installs
verified bytes (a cut blob resumes with a Range request from where it broke); it never installs
bad bytes and never reports an outage as a miss. Publishing: it fails loudly and no tag ever
names a manifest without its blobs.
"""

from __future__ import annotations

import time
import uuid

import pytest

from prebake.artifacts.bake.fetch import Miss, fetch
from prebake.artifacts.errors import BundleError
from prebake.registry.errors import BlobDigestMismatch, RegistryError, RegistryUnavailable
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import actor, result, unbounded
from tests.support.bundles import make_bundle
from tests.support.moto_server import free_port
from tests.support.oci_server import OCIServer, oci_available, oci_server

FAST = {"PREBAKE_OCI_TIMEOUT_S": "1", "PREBAKE_OCI_MAX_ATTEMPTS": "2", "PREBAKE_OCI_SETTLE_S": "0.1"}


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    if not oci_available():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    with oci_server(tmp_path_factory.mktemp("oci-faults")) as server:
        yield server


@pytest.fixture
def oci(origin: OCIServer, monkeypatch, tmp_path, scenario):
    """A fresh repository holding one bundle, a fault proxy in front of the server, the environment set."""
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci_client import OCISettings

    for name in list(FAST) + ["PREBAKE_OCI_CA_BUNDLE", "PREBAKE_OCI_USERNAME", "DOCKER_CONFIG"]:
        monkeypatch.delenv(name, raising=False)
    repo = f"faults/r{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    bundle = make_bundle(tmp_path / "bake", payload_bytes=256 << 10)
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    with fault_proxy(origin.url) as proxy:
        host = proxy.url.removeprefix("http://")
        env = {**FAST, "PREBAKE_OCI_PLAIN_HTTP": host}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        yield _OCI(f"oci://{host}/{repo}", direct, bundle, proxy, env, OCIRegistry(f"oci://{host}/{repo}"))


class _OCI:
    def __init__(self, address, direct, bundle, proxy, env, registry):
        self.address, self.direct, self.bundle, self.proxy, self.env, self.registry = (
            address,
            direct,
            bundle,
            proxy,
            env,
            registry,
        )


def _nothing_installed(store, bundle) -> None:
    assert store.lookup("graphs", bundle.manifest.key_digest) is None
    assert not list(store.home.glob("trees/*")) and not list(store.home.glob("blobs/sha256/*/*"))


# -- reading ---------------------------------------------------------------------------------


def test_an_oci_registry_that_is_down_is_a_clear_error_within_seconds_and_installs_nothing(tmp_path, oci, scenario):
    from prebake.registry.oci import OCIRegistry

    host = f"127.0.0.1:{free_port()}"  # nothing listens there
    down = OCIRegistry(f"oci://{host}/team/x", env={**oci.env, "PREBAKE_OCI_PLAIN_HTTP": host})
    store = unbounded(scenario.store(tmp_path / "home"))
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        fetch(store, down, oci.bundle.manifest.the_key())
    assert time.monotonic() - started < 15
    _nothing_installed(store, oci.bundle)


def test_an_oci_registry_slower_than_the_timeout_is_given_up_on_not_waited_for(tmp_path, oci, scenario):
    oci.proxy.inject(Fault("GET", "/manifests/", "slow", seconds=8))
    store = unbounded(scenario.store(tmp_path / "home"))
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="did not answer within 1 s"):
        fetch(store, oci.registry, oci.bundle.manifest.the_key())
    assert time.monotonic() - started < 7, "each attempt waits 1 s, not the server's 8"
    _nothing_installed(store, oci.bundle)


def test_oci_500s_are_retried_then_reported_and_the_next_fetch_recovers(tmp_path, oci, scenario):
    oci.proxy.inject(Fault("GET", "/blobs/", "error500"))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(RegistryUnavailable, match="HTTP 500"):
        fetch(store, oci.registry, oci.bundle.manifest.the_key())
    assert oci.proxy.count("GET", "/blobs/") >= 2, "a 500 is retried before giving up"
    _nothing_installed(store, oci.bundle)

    oci.proxy.clear()
    got = fetch(store, oci.registry, oci.bundle.manifest.the_key())
    assert not isinstance(got, Miss) and store_problems(store.home) == []


def test_a_connection_cut_mid_blob_resumes_from_the_byte_it_reached(tmp_path, oci, scenario):
    oci.proxy.inject(Fault("GET", "/blobs/", "cut"))  # every whole-blob GET is cut half way; ranged ones pass
    store = unbounded(scenario.store(tmp_path / "home"))

    got = fetch(store, oci.registry, oci.bundle.manifest.the_key())

    assert not isinstance(got, Miss) and store_problems(store.home) == []
    assert oci.proxy.count("GET", "/blobs/") == 2, "one cut GET, then one ranged GET for the rest"
    assert oci.proxy.bytes_sent("/blobs/") < 2 * oci.bundle.manifest.blob.size, "the first half was not sent twice"


@pytest.mark.parametrize(
    ("fault", "error"),
    [("short", BlobDigestMismatch), ("corrupt", BlobDigestMismatch)],
    ids=["short-body", "wrong-bytes"],
)
def test_a_bad_oci_blob_body_is_refused_and_nothing_is_installed(tmp_path, oci, scenario, fault, error):
    oci.proxy.inject(Fault("GET", "/blobs/", fault))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(error) as raised:
        fetch(store, oci.registry, oci.bundle.manifest.the_key())
    assert oci.bundle.manifest.blob.digest[:20] in str(raised.value)
    _nothing_installed(store, oci.bundle)
    assert not list(store.home.glob("blobs/sha256/*/.tmp-*")), "the failed download's temporary is gone"


def test_a_wrong_index_entry_from_the_wire_is_refused_not_installed(tmp_path, oci, scenario):
    oci.proxy.inject(Fault("GET", "/manifests/", "corrupt"))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(BundleError, match="prebake"):
        fetch(store, oci.registry, oci.bundle.manifest.the_key())
    _nothing_installed(store, oci.bundle)


# -- publishing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "blob_went_up"),
    [
        (Fault("PUT", "/blobs/uploads/", "error500"), False),
        (Fault("PUT", "/blobs/uploads/", "cut"), False),
        (Fault("PUT", "/manifests/", "error500"), True),  # the blobs went up; no manifest names them
    ],
    ids=["500-on-blob-upload", "blob-upload-cut", "500-on-manifest"],
)
def test_a_failing_oci_publish_is_loud_and_leaves_no_tag(tmp_path, oci, scenario, fault, blob_went_up):
    from prebake.registry.oci_artifact import Blob

    other = make_bundle(tmp_path / "bake", model="other", payload_bytes=64 << 10)
    before = set(oci.direct.tags())
    oci.proxy.inject(fault)
    with pytest.raises(RegistryError, match="cannot publish into"):
        oci.registry.publish(other.manifest, other.blob)

    assert set(oci.direct.tags()) == before, "no new tag"
    assert oci.direct.lookup("graphs", other.manifest.key_digest) is None
    layer = Blob("", other.manifest.blob.digest, other.manifest.blob.size)
    assert oci.direct._has_blob(layer) is blob_went_up

    oci.proxy.clear()
    assert oci.registry.publish(other.manifest, other.blob).created is True
    scenario.registry(oci.direct, other.manifest)


# -- processes -------------------------------------------------------------------------------


def test_six_processes_fetching_from_oci_at_once_download_the_blob_once(tmp_path, oci, scenario):
    home, go = scenario.store(tmp_path / "home"), tmp_path / "go"
    key = oci.bundle.manifest.key_digest
    args = ["--home", str(home), "--registry", oci.address, "--key", key, "--go", str(go)]
    procs = [actor("fetch", *args, env=oci.env) for _ in range(6)]
    go.touch()
    results = [result(p) for p in procs]
    assert oci.proxy.count("GET", "/blobs/") == 1, "the server saw one download of the blob"
    assert len({r["tree"] for r in results}) == 1 and all(r["problems"] == [] for r in results)


def test_two_bakers_racing_on_oci_leave_one_entry_and_neither_fails(tmp_path, oci, scenario):
    go = tmp_path / "go"
    procs = [
        actor(
            "bake",
            "--home",
            str(scenario.store(tmp_path / f"home-{i}")),
            "--registry",
            oci.address,
            "--build",
            build,
            "--go",
            str(go),
            env=oci.env,
        )
        for i, build in enumerate(("one", "two"))
    ]
    go.touch()
    results = [result(p, timeout=120) for p in procs]
    assert sorted(r["created"] for r in results) == [False, True]
    (entry,) = oci.direct.list("buckets")
    assert {r["blob"] for r in results} == {entry.blob.digest}
    scenario.registry(oci.direct, entry)
