"""What only the S3 backend does: multipart transfers, the layout under a prefix, the fallback
for servers without conditional writes, and faults that name the endpoint and bucket."""

from __future__ import annotations

import logging

import pytest

from prebake.artifacts.layout import blob_relpath, index_relpath
from prebake.artifacts.ports.errors import PublishConflict, RegistryError, RegistryNotFound, RegistryUnavailable
from prebake.registry.backends.s3 import S3Registry
from prebake.registry.backends.s3_client import S3Settings
from tests.faults.fault_proxy import Fault, fault_proxy
from tests.support.ports import free_port


def test_bundle_lands_under_the_prefix_in_the_shared_layout(s3_bucket, s3_client, bundle):
    b = bundle()
    S3Registry(f"s3://{s3_bucket}/fleet/a").publish(b.manifest, b.blob)

    keys = {o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]}

    assert keys == {
        "fleet/a/" + index_relpath(b.manifest.kind, b.manifest.key_digest),
        "fleet/a/" + blob_relpath(b.manifest.blob.digest),
    }


def test_a_large_blob_goes_up_in_parts_and_comes_back_verified(s3_bucket, s3_client, bundle, tmp_path):
    b = bundle(payload_bytes=12 << 20)
    registry = S3Registry(f"s3://{s3_bucket}/big", S3Settings(chunk_mb=5, concurrency=4))

    registry.publish(b.manifest, b.blob)
    etag = s3_client.head_object(Bucket=s3_bucket, Key="big/" + blob_relpath(b.manifest.blob.digest))["ETag"]
    fetched = registry.fetch_blob(b.manifest.blob.digest, tmp_path / "big.tar.zst")

    assert etag.strip('"').endswith("-3"), f"expected a 3-part multipart upload, got ETag {etag}"
    assert fetched.read_bytes() == b.blob.read_bytes()


def test_a_server_without_conditional_writes_gets_the_safe_fallback(
    s3_endpoint, s3_bucket, monkeypatch, bundle, caplog
):
    first, second = bundle(build="first"), bundle(build="second")
    with fault_proxy(s3_endpoint) as proxy:
        proxy.inject(Fault("PUT", "", "no-conditional"))
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        registry = S3Registry(f"s3://{s3_bucket}/old-server")

        with caplog.at_level(logging.WARNING, logger="prebake.registry.backends.s3"):
            created = registry.publish(first.manifest, first.blob)
        again = registry.publish(first.manifest, first.blob)
        with pytest.raises(PublishConflict):
            registry.publish(second.manifest, second.blob)

    assert created.created and not again.created
    assert "does not support conditional writes" in caplog.text
    assert registry.lookup(first.manifest.kind, first.manifest.key_digest) == first.manifest


def test_a_missing_bucket_says_how_to_create_it(s3_client):
    registry = S3Registry("s3://no-such-prebake-bucket/x")

    with pytest.raises(RegistryNotFound, match=r"does not exist.*aws s3 mb s3://no-such-prebake-bucket"):
        registry.lookup("graphs", "0" * 64)


def test_a_missing_blob_behind_an_index_entry_is_an_error_not_a_miss(s3_bucket, s3_client, bundle, tmp_path):
    b = bundle()
    S3Registry(f"s3://{s3_bucket}/p").publish(b.manifest, b.blob)
    s3_client.delete_object(Bucket=s3_bucket, Key="p/" + blob_relpath(b.manifest.blob.digest))

    with pytest.raises(RegistryError, match="missing"):
        S3Registry(f"s3://{s3_bucket}/p").fetch_blob(b.manifest.blob.digest, tmp_path / "x.tar.zst")


def test_a_down_endpoint_is_named_with_its_bucket(s3_client, monkeypatch):
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    registry = S3Registry("s3://team-bucket/prebake", S3Settings(max_attempts=1, timeout_s=1))

    with pytest.raises(RegistryUnavailable, match=rf"{endpoint} \(bucket team-bucket\).*AWS_ENDPOINT_URL"):
        registry.lookup("graphs", "0" * 64)


def test_settings_come_from_prebake_s3_variables():
    settings = S3Settings.from_env(
        {
            "PREBAKE_S3_CONCURRENCY": "3",
            "PREBAKE_S3_CHUNK_MB": "16",
            "PREBAKE_S3_RETRY_MODE": "adaptive",
            "PREBAKE_S3_CONDITIONAL_PUT": "off",
        }
    )

    assert (settings.concurrency, settings.chunk_mb, settings.retry_mode, settings.conditional_put) == (
        3,
        16,
        "adaptive",
        False,
    )
    assert S3Settings.from_env({}) == S3Settings()


@pytest.mark.parametrize(
    "env, complaint",
    [
        ({"PREBAKE_S3_CONCURRENCY": "many"}, "PREBAKE_S3_CONCURRENCY='many' is not valid"),
        ({"PREBAKE_S3_CHUNK_MB": "1"}, "at least 5"),
        ({"PREBAKE_S3_RETRY_MODE": "eager"}, "retry_mode"),
        ({"PREBAKE_S3_CONDITIONAL_PUT": "maybe"}, "on or off"),
    ],
)
def test_bad_settings_are_refused_with_the_variable_named(env, complaint):
    with pytest.raises(RegistryError, match=complaint):
        S3Settings.from_env(env)


@pytest.mark.parametrize("address", ["s3://", "s3:///prefix-only"])
def test_an_address_without_a_bucket_is_refused(address):
    with pytest.raises(RegistryError, match="names no bucket"):
        S3Registry(address)
