"""An S3 or OCI registry that misbehaves: down, too slow, 500s, cut, short and wrong bodies, a reader
killed mid-download, failing uploads, racing processes. One suite over both backends: real boto3
talks real HTTP to moto's server, the OCI client to Debian's docker-registry, each through the
proxy that injects the fault (tests/faults/fault_proxy.py). Every bundle is signed and fetched
under the policy in force (tests/faults/in_force.py).

Reading: fetch raises a RegistryError subclass naming the registry and the fix, or installs
verified bytes; it never installs bad bytes and never reports an outage as a miss. Publishing:
it fails loudly and no index entry (an S3 object under index/, an OCI tag) ever names a bundle
without its blob. A few faults are one backend's own: an S3 cut is an outage (botocore does not
resume), an OCI cut resumes with a Range request; an S3 server checksum catches wrong bytes first.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from prebake.artifacts.errors import BundleError
from prebake.artifacts.layout import blob_relpath
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryError, RegistryUnavailable
from prebake.artifacts.store.local import Installed
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import actor, killed, racing_bakers, result, unbounded
from tests.support.bundles import Bundle
from tests.support.moto_server import s3_env
from tests.support.ports import free_port

FAST = {
    "s3": {"PREBAKE_S3_TIMEOUT_S": "1", "PREBAKE_S3_MAX_ATTEMPTS": "2"},  # give up in seconds, not minutes
    "oci": {"PREBAKE_OCI_TIMEOUT_S": "1", "PREBAKE_OCI_MAX_ATTEMPTS": "2", "PREBAKE_OCI_SETTLE_S": "0.1"},
}


@dataclass(frozen=True)
class Remote:
    """One backend's registry holding one signed bundle, reached through a fault proxy."""

    backend: str
    address: str
    direct: object  # straight to the server: for setting up and checking
    registry: object  # through the proxy
    bundle: Bundle
    proxy: object
    env: dict[str, str]  # what a child process needs to reach the registry through the proxy
    index_path: str  # what the proxy sees of an index entry: S3 objects under index/, OCI manifests
    blob_upload: str  # what it sees of a blob upload
    server_error: str  # how the client says a 500
    down: Callable[[], object]  # the same kind of registry with nothing listening

    def entries(self) -> set[str]:
        """The index entries the server holds (S3 keys under index/, OCI tags)."""
        if self.backend == "oci":
            return set(self.direct.tags())
        import boto3

        client = boto3.client("s3", endpoint_url=self.direct.s3.endpoint)
        listed = client.list_objects_v2(Bucket=self.direct.s3.bucket).get("Contents", ())
        return {o["Key"] for o in listed if "/index/" in o["Key"]}

    def has_blob(self, bundle: Bundle) -> bool:
        blob = bundle.manifest.blob
        if self.backend == "oci":
            from prebake.registry.oci.artifact import Blob

            return self.direct._has_blob(Blob("", blob.digest, blob.size))
        return self.direct.store.head(blob_relpath(blob.digest)) is not None


@pytest.fixture(params=["s3", "oci"])
def remote(request, monkeypatch, tmp_path, scenario, in_force):
    """A fresh bucket or repository holding one signed bundle, a fault proxy in front, the environment set."""
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=256 << 10)
    opened = _s3 if request.param == "s3" else _oci
    yield from opened(request, monkeypatch, scenario, bundle)


def _s3(request, monkeypatch, scenario, bundle):

    from prebake.registry.backends.s3 import S3Registry
    from prebake.registry.backends.s3_client import S3Settings

    moto, bucket = request.getfixturevalue("moto"), request.getfixturevalue("bucket")
    address = f"s3://{bucket}/prebake"
    direct = S3Registry(address, S3Settings())
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    with fault_proxy(moto) as proxy:
        env = {**s3_env(proxy.url), **FAST["s3"]}
        for name, value in env.items():
            monkeypatch.setenv(name, value)

        def down():
            monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
            return S3Registry(address)

        yield Remote(
            "s3",
            address,
            direct,
            S3Registry(address),
            bundle,
            proxy,
            env,
            "/index/",
            "/blobs/",
            "InternalError",
            down,
        )


def _oci(request, monkeypatch, scenario, bundle):
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    origin = request.getfixturevalue("origin")
    for name in [*FAST["oci"], "PREBAKE_OCI_CA_BUNDLE", "PREBAKE_OCI_USERNAME", "DOCKER_CONFIG"]:
        monkeypatch.delenv(name, raising=False)
    repo = f"faults/r{uuid.uuid4().hex[:10]}"
    direct = OCIRegistry(origin.address(repo), OCISettings(plain_http=(origin.host,), settle_s=0.1))
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    with fault_proxy(origin.url) as proxy:
        host = proxy.url.removeprefix("http://")
        env = {**FAST["oci"], "PREBAKE_OCI_PLAIN_HTTP": host}
        for name, value in env.items():
            monkeypatch.setenv(name, value)

        def down():
            nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
            return OCIRegistry(f"oci://{nowhere}/team/x", env={**env, "PREBAKE_OCI_PLAIN_HTTP": nowhere})

        address = f"oci://{host}/{repo}"
        yield Remote(
            "oci",
            address,
            direct,
            OCIRegistry(address),
            bundle,
            proxy,
            env,
            "/manifests/",
            "/blobs/uploads/",
            "HTTP 500",
            down,
        )


def _nothing_installed(store, bundle) -> None:
    assert store.lookup("graphs", bundle.manifest.key_digest) is None
    assert not list(store.home.glob("trees/*")) and not list(store.home.glob("blobs/sha256/*/*"))


# -- reading ---------------------------------------------------------------------------------


def test_a_registry_that_is_down_is_a_clear_error_within_seconds_and_installs_nothing(
    tmp_path, remote, scenario, in_force
):
    store = unbounded(scenario.store(tmp_path / "home"))
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        in_force.fetch(store, remote.down(), remote.bundle.manifest.the_key())
    assert time.monotonic() - started < 15
    _nothing_installed(store, remote.bundle)


def test_a_registry_slower_than_the_timeout_is_given_up_on_not_waited_for(tmp_path, remote, scenario, in_force):
    remote.proxy.inject(Fault("GET", remote.index_path, "slow", seconds=8))
    store = unbounded(scenario.store(tmp_path / "home"))
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        in_force.fetch(store, remote.registry, remote.bundle.manifest.the_key())
    assert time.monotonic() - started < 7, "each attempt waits 1 s, not the server's 8"
    _nothing_installed(store, remote.bundle)


def test_http_500s_are_retried_then_reported_and_the_next_fetch_recovers(tmp_path, remote, scenario, in_force):
    remote.proxy.inject(Fault("GET", "/blobs/", "error500"))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(RegistryUnavailable, match=remote.server_error):
        in_force.fetch(store, remote.registry, remote.bundle.manifest.the_key())
    assert remote.proxy.count("GET", "/blobs/") >= 2, "a 500 is retried before giving up"
    _nothing_installed(store, remote.bundle)

    remote.proxy.clear()
    got = in_force.fetch(store, remote.registry, remote.bundle.manifest.the_key())
    assert isinstance(got, Installed) and got.manifest.signatures and store_problems(store.home) == []


@pytest.mark.parametrize(
    ("remote", "fault", "error"),
    [
        ("s3", "cut", RegistryUnavailable),
        ("s3", "short", BlobDigestMismatch),
        ("s3", "corrupt", BlobDigestMismatch),
        ("s3", "corrupt+checksum", BlobDigestMismatch),  # botocore's response checksum catches it before our sha256
        ("oci", "short", BlobDigestMismatch),
        ("oci", "corrupt", BlobDigestMismatch),
    ],
    ids=[
        "s3-connection-cut-mid-body",
        "s3-short-body",
        "s3-wrong-bytes",
        "s3-wrong-bytes-server-checksum",
        "oci-short-body",
        "oci-wrong-bytes",
    ],
    indirect=["remote"],
)
def test_a_bad_blob_body_is_refused_and_nothing_is_installed(tmp_path, remote, scenario, in_force, fault, error):
    remote.proxy.inject(Fault("GET", "/blobs/", fault))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(error) as raised:
        in_force.fetch(store, remote.registry, remote.bundle.manifest.the_key())
    said = str(raised.value)
    assert remote.bundle.manifest.blob.digest[:20] in said or "blobs/sha256" in said
    _nothing_installed(store, remote.bundle)
    assert not list(store.home.glob("blobs/sha256/*/.tmp-*")), "the failed download's temporary is gone"


@pytest.mark.parametrize("remote", ["oci"], indirect=True)
def test_an_oci_connection_cut_mid_blob_resumes_from_the_byte_it_reached(tmp_path, remote, scenario, in_force):
    remote.proxy.inject(Fault("GET", "/blobs/", "cut"))  # every whole-blob GET is cut half way; ranged ones pass
    store = unbounded(scenario.store(tmp_path / "home"))

    got = in_force.fetch(store, remote.registry, remote.bundle.manifest.the_key())

    assert isinstance(got, Installed) and got.manifest.signatures and store_problems(store.home) == []
    assert remote.proxy.count("GET", "/blobs/") == 2, "one cut GET, then one ranged GET for the rest"
    assert remote.proxy.bytes_sent("/blobs/") < 2 * remote.bundle.manifest.blob.size, (
        "the first half was not sent twice"
    )


@pytest.mark.parametrize("remote", ["oci"], indirect=True)
def test_a_wrong_oci_index_entry_from_the_wire_is_refused_not_installed(tmp_path, remote, scenario, in_force):
    remote.proxy.inject(Fault("GET", "/manifests/", "corrupt"))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(BundleError, match="prebake"):
        in_force.fetch(store, remote.registry, remote.bundle.manifest.the_key())
    _nothing_installed(store, remote.bundle)


# -- publishing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "fault", "blob_went_up"),
    [("blob", "error500", False), ("blob", "cut", False), ("index", "error500", True)],  # index: no entry names it
    ids=["500-on-blob-upload", "blob-upload-cut", "500-on-index-entry"],
)
def test_a_failing_publish_is_loud_and_leaves_no_entry_without_its_blob(
    tmp_path, remote, scenario, in_force, step, fault, blob_went_up
):
    other = in_force.bundle(tmp_path / "bake", model="other", payload_bytes=64 << 10)
    before = remote.entries()
    remote.proxy.inject(Fault("PUT", remote.blob_upload if step == "blob" else remote.index_path, fault))
    with pytest.raises(RegistryError, match="cannot publish"):
        remote.registry.publish(other.manifest, other.blob)

    assert remote.entries() == before, "no new index entry"
    assert remote.direct.lookup("graphs", other.manifest.key_digest) is None
    assert remote.has_blob(other) is blob_went_up

    remote.proxy.clear()
    assert remote.registry.publish(other.manifest, other.blob).created is True
    scenario.registry(remote.direct, other.manifest)


# -- processes -------------------------------------------------------------------------------


def test_six_processes_fetching_at_once_download_the_blob_once(tmp_path, remote, scenario):
    home, go = scenario.store(tmp_path / "home"), tmp_path / "go"
    key = remote.bundle.manifest.key_digest
    args = ["--home", str(home), "--registry", remote.address, "--key", key, "--go", str(go)]
    procs = [actor("fetch", *args, env=remote.env) for _ in range(6)]
    go.touch()
    results = [result(p) for p in procs]
    assert remote.proxy.count("GET", "/blobs/") == 1, "the server saw one download of the blob"
    assert len({r["tree"] for r in results}) == 1 and all(r["problems"] == [] for r in results)


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_a_reader_killed_mid_download_leaves_nothing_readable_and_the_next_fetch_succeeds(tmp_path, remote, scenario):
    remote.proxy.inject(Fault("GET", "/blobs/", "throttle", seconds=0.02))  # 256 KiB in ~1.3 s
    home = scenario.store(tmp_path / "home")
    args = ["--home", str(home), "--registry", remote.address, "--key", remote.bundle.manifest.key_digest]
    reader = actor("fetch", *args, env=remote.env)
    deadline = time.monotonic() + 30
    while remote.proxy.bytes_sent("/blobs/") < 64 << 10:
        assert time.monotonic() < deadline and reader.poll() is None, "the download never got going"
        time.sleep(0.01)
    reader.send_signal(signal.SIGKILL)
    killed(reader)
    assert remote.proxy.bytes_sent("/blobs/") < remote.bundle.manifest.blob.size, "killed mid-body, not after"

    store = unbounded(home)
    assert store.lookup("graphs", remote.bundle.manifest.key_digest) is None
    assert list(home.glob("blobs/sha256/*/.tmp-*")), "the half download is left under a temporary name"
    assert store_problems(home) == []

    remote.proxy.clear()
    assert result(actor("fetch", *args, env=remote.env))["problems"] == []
    assert not list(home.glob("blobs/sha256/*/.tmp-*")), "the next fetch removed the dead reader's half download"


def test_two_bakers_racing_leave_one_signed_entry_and_neither_fails(tmp_path, remote, scenario):
    results = racing_bakers(tmp_path, scenario, remote.address, ("one", "two"), env=remote.env)
    assert sorted(r["created"] for r in results) == [False, True]
    (entry,) = remote.direct.list("buckets")
    assert {r["blob"] for r in results} == {entry.blob.digest}
    assert [s.signer for s in entry.signatures] == ["fleet"], "the winner signed it with the fleet key"
    scenario.registry(remote.direct, entry)


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_an_s3_server_asking_to_retry_after_two_seconds_is_waited_for_then_read(
    tmp_path, remote, scenario, in_force, status
):
    """botocore reads only x-amz-retry-after (and waits at most 5 s past its backoff): S3-compatible servers
    and proxies send Retry-After, which prebake's hook waits for (tests/faults/test_oci_retry_after.py: OCI)."""
    asked = 2.0
    remote.proxy.inject(Fault("GET", "/blobs/", f"busy{status}", seconds=asked, times=1))
    store = unbounded(scenario.store(tmp_path / "home"))
    got = in_force.fetch(store, remote.registry, remote.bundle.manifest.the_key())
    statuses, answered = remote.proxy.statuses("GET", "/blobs/"), remote.proxy.answered_at("GET", "/blobs/")
    assert isinstance(got, Installed), got
    assert statuses[0] == status and statuses[-1] == 200, statuses
    waited = answered[1] - answered[0]
    assert waited >= asked - 0.05, f"asked to wait {asked} s, asked again after {waited:.2f} s"
    assert store_problems(store.home) == []


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_an_s3_blob_redirected_to_another_host_gets_no_signature_there(tmp_path, remote, moto, scenario, in_force):
    """botocore follows no HTTP redirect itself (urllib3 runs with redirects off): a 307 of the blob GET to
    another host is an error named for the endpoint, and nothing signed with the registry's keys goes there."""
    with fault_proxy(moto) as storage:
        remote.proxy.inject(Fault("GET", "/blobs/", "redirect", to=storage.url))
        store = unbounded(scenario.store(tmp_path / "home"))
        with pytest.raises(RegistryError, match="s3://"):
            in_force.fetch(store, remote.registry, remote.bundle.manifest.the_key())
        signed = [c for c in storage.credentials("GET", "/blobs/") if c]
    assert remote.proxy.statuses("GET", "/blobs/")[:1] == [307], "the redirect was not answered"
    assert signed == [], f"the registry's signature reached the other host: {signed}"
    _nothing_installed(store, remote.bundle)
