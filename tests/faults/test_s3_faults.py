"""An S3 registry that misbehaves: down, too slow, 500s, cut and short bodies, wrong bytes, a
reader killed mid-download. Real boto3 talks real HTTP to moto's server through a proxy that
injects each fault (tests/faults/fault_proxy.py).

Reading: fetch raises a RegistryError subclass naming the endpoint and the fix, or misses;
it never installs bad bytes. Publishing: it fails loudly and the registry keeps no entry
without its whole blob.
"""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from prebake.artifacts.bake.fetch import Miss, fetch
from prebake.registry.errors import BlobDigestMismatch, RegistryError, RegistryUnavailable
from tests.faults.checks import store_problems
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.faults.procs import actor, killed, result, unbounded
from tests.support.bundles import make_bundle
from tests.support.moto_server import free_port, moto_server, s3_env

FAST = {"PREBAKE_S3_TIMEOUT_S": "1", "PREBAKE_S3_MAX_ATTEMPTS": "2"}  # give up in seconds, not minutes


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(moto, monkeypatch, tmp_path, scenario):
    """A fresh bucket holding one bundle, a fault proxy in front of it, and the environment pointing at the proxy."""
    import boto3

    from prebake.registry.s3 import S3Registry, S3Settings

    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_env(moto).items():
        monkeypatch.setenv(name, value)
    bucket = f"faults-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    address = f"s3://{bucket}/prebake"
    direct = S3Registry(address, S3Settings())  # straight to the server: for setting up and checking
    bundle = make_bundle(tmp_path / "bake", payload_bytes=256 << 10)
    direct.publish(bundle.manifest, bundle.blob)
    scenario.registry(direct, bundle.manifest)
    with fault_proxy(moto) as proxy:
        env = {**s3_env(proxy.url), **FAST}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        yield _S3(address, direct, bundle, proxy, env, S3Registry(address))


class _S3:
    def __init__(self, address, direct, bundle, proxy, env, registry):
        self.address, self.direct, self.bundle, self.proxy, self.env, self.registry = (
            address,
            direct,
            bundle,
            proxy,
            env,
            registry,
        )

    def objects(self) -> list[str]:
        import boto3

        bucket = self.address.removeprefix("s3://").split("/")[0]
        client = boto3.client("s3", endpoint_url=self.direct.endpoint)
        return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", ()))


def _nothing_installed(store, bundle) -> None:
    assert store.lookup("graphs", bundle.manifest.key_digest) is None
    assert not list(store.home.glob("trees/*")) and not list(store.home.glob("blobs/sha256/*/*"))


# -- reading ---------------------------------------------------------------------------------


def test_a_registry_that_is_down_is_a_clear_error_within_seconds_and_installs_nothing(
    tmp_path, s3, monkeypatch, scenario
):
    from prebake.registry.s3 import S3Registry

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    store = unbounded(scenario.store(tmp_path / "home"))
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        fetch(store, S3Registry(s3.address), s3.bundle.manifest.the_key())
    assert time.monotonic() - started < 15
    _nothing_installed(store, s3.bundle)


def test_a_registry_slower_than_the_timeout_is_given_up_on_not_waited_for(tmp_path, s3, scenario):
    s3.proxy.inject(Fault("GET", "/index/", "slow", seconds=8))
    store = unbounded(scenario.store(tmp_path / "home"))
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        fetch(store, s3.registry, s3.bundle.manifest.the_key())
    assert time.monotonic() - started < 7, "each attempt waits 1 s, not the server's 8"
    _nothing_installed(store, s3.bundle)


def test_http_500s_are_retried_then_reported_and_the_next_fetch_recovers(tmp_path, s3, scenario):
    s3.proxy.inject(Fault("GET", "/blobs/", "error500"))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(RegistryUnavailable, match="InternalError"):
        fetch(store, s3.registry, s3.bundle.manifest.the_key())
    assert s3.proxy.count("GET", "/blobs/") >= 2, "a 500 is retried before giving up"
    _nothing_installed(store, s3.bundle)

    s3.proxy.clear()
    got = fetch(store, s3.registry, s3.bundle.manifest.the_key())
    assert not isinstance(got, Miss) and store_problems(store.home) == []


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("cut", RegistryUnavailable),
        ("short", BlobDigestMismatch),
        ("corrupt", BlobDigestMismatch),
        ("corrupt+checksum", BlobDigestMismatch),  # botocore's response checksum catches it before our sha256
    ],
    ids=["connection-cut-mid-body", "short-body", "wrong-bytes", "wrong-bytes-server-checksum"],
)
def test_a_bad_blob_body_is_refused_and_nothing_is_installed(tmp_path, s3, scenario, fault, error):
    s3.proxy.inject(Fault("GET", "/blobs/", fault))
    store = unbounded(scenario.store(tmp_path / "home"))
    with pytest.raises(error) as raised:
        fetch(store, s3.registry, s3.bundle.manifest.the_key())
    assert s3.bundle.manifest.blob.digest[:20] in str(raised.value) or "blobs/sha256" in str(raised.value)
    _nothing_installed(store, s3.bundle)
    assert not list(store.home.glob("blobs/sha256/*/.tmp-*")), "the failed download's temporary is gone"


# -- publishing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "changed"),
    [
        (Fault("PUT", "/blobs/", "error500"), False),
        (Fault("PUT", "/blobs/", "cut"), False),
        (Fault("PUT", "/index/", "error500"), True),  # the blob went up; its entry did not
    ],
    ids=["500-on-blob-upload", "blob-upload-cut", "500-on-index-entry"],
)
def test_a_failing_publish_is_loud_and_leaves_no_entry_without_its_blob(tmp_path, s3, scenario, fault, changed):
    other = make_bundle(tmp_path / "bake", model="other", payload_bytes=64 << 10)
    before = s3.objects()
    s3.proxy.inject(fault)
    with pytest.raises(RegistryError, match="cannot publish"):
        s3.registry.publish(other.manifest, other.blob)

    after = s3.objects()
    assert [k for k in after if "/index/" in k] == [k for k in before if "/index/" in k], "no new index entry"
    assert (after != before) is changed
    assert s3.direct.lookup("graphs", other.manifest.key_digest) is None

    s3.proxy.clear()
    assert s3.registry.publish(other.manifest, other.blob).created is True
    scenario.registry(s3.direct, other.manifest)


# -- processes -------------------------------------------------------------------------------


def test_six_processes_fetching_from_s3_at_once_download_the_blob_once(tmp_path, s3, scenario):
    home, go = scenario.store(tmp_path / "home"), tmp_path / "go"
    args = ["--home", str(home), "--registry", s3.address, "--key", s3.bundle.manifest.key_digest, "--go", str(go)]
    procs = [actor("fetch", *args, env=s3.env) for _ in range(6)]
    go.touch()
    results = [result(p) for p in procs]
    assert s3.proxy.count("GET", "/blobs/") == 1, "the server saw one download of the blob"
    assert len({r["tree"] for r in results}) == 1 and all(r["problems"] == [] for r in results)


def test_a_reader_killed_mid_download_leaves_nothing_readable_and_the_next_fetch_succeeds(tmp_path, s3, scenario):
    s3.proxy.inject(Fault("GET", "/blobs/", "throttle", seconds=0.02))  # 256 KiB in ~1.3 s
    home = scenario.store(tmp_path / "home")
    args = ["--home", str(home), "--registry", s3.address, "--key", s3.bundle.manifest.key_digest]
    reader = actor("fetch", *args, env=s3.env)
    deadline = time.monotonic() + 30
    while s3.proxy.bytes_sent("/blobs/") < 64 << 10:
        assert time.monotonic() < deadline and reader.poll() is None, "the download never got going"
        time.sleep(0.01)
    reader.send_signal(signal.SIGKILL)
    killed(reader)
    assert s3.proxy.bytes_sent("/blobs/") < s3.bundle.manifest.blob.size, "killed mid-body, not after"

    store = unbounded(home)
    assert store.lookup("graphs", s3.bundle.manifest.key_digest) is None
    assert list(home.glob("blobs/sha256/*/.tmp-*")), "the half download is left under a temporary name"
    assert store_problems(home) == []

    s3.proxy.clear()
    assert result(actor("fetch", *args, env=s3.env))["problems"] == []
    assert not list(home.glob("blobs/sha256/*/.tmp-*")), "the next fetch removed the dead reader's half download"


def test_two_bakers_racing_on_s3_leave_one_entry_and_neither_fails(tmp_path, s3, scenario):
    go = tmp_path / "go"
    procs = [
        actor(
            "bake",
            "--home",
            str(scenario.store(tmp_path / f"home-{i}")),
            "--registry",
            s3.address,
            "--build",
            build,
            "--go",
            str(go),
            env=s3.env,
        )
        for i, build in enumerate(("one", "two"))
    ]
    go.touch()
    results = [result(p) for p in procs]
    assert sorted(r["created"] for r in results) == [False, True]
    (entry,) = s3.direct.list("buckets")
    assert {r["blob"] for r in results} == {entry.blob.digest}
    scenario.registry(s3.direct, entry)
