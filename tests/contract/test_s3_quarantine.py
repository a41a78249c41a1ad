"""`prebake verify --quarantine` on S3 (moto): bad entries move under quarantine/, nothing is deleted."""

from __future__ import annotations

from prebake.artifacts.layout import blob_relpath, index_relpath
from prebake.artifacts.ports.registry import Maintainable
from prebake.registry.backends.s3 import S3Registry
from prebake.registry.review.verify import verify_registry
from tests.support.bundles import make_bundle


def test_s3_quarantine_moves_a_corrupt_bundle_and_a_malformed_entry_aside(s3_bucket, s3_client, tmp_path):
    registry = S3Registry(f"s3://{s3_bucket}/team")
    assert isinstance(registry, Maintainable)
    good = make_bundle(tmp_path, model="good")
    bad = make_bundle(tmp_path, model="bad")
    for b in (good, bad):
        registry.publish(b.manifest, b.blob)
    bad_blob = f"team/{blob_relpath(bad.manifest.blob.digest)}"
    body = bytearray(s3_client.get_object(Bucket=s3_bucket, Key=bad_blob)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3_client.put_object(Bucket=s3_bucket, Key=bad_blob, Body=bytes(body))
    junk = f"team/{index_relpath('graphs', 'f' * 64)}"
    s3_client.put_object(Bucket=s3_bucket, Key=junk, Body=b"{not json")

    report = verify_registry(registry, trust=None, quarantine=True)

    assert report.exit_code == 1 and len(report.findings) == 2
    assert all(f.quarantined_to and "/team/quarantine/index/graphs/" in f.quarantined_to for f in report.findings)
    keys = {o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="team/")["Contents"]}
    assert f"team/quarantine/{blob_relpath(bad.manifest.blob.digest)}" in keys and bad_blob not in keys
    assert f"team/quarantine/{index_relpath('graphs', 'f' * 64)}" in keys and junk not in keys
    assert registry.lookup("graphs", bad.manifest.key_digest) is None
    assert registry.lookup("graphs", good.manifest.key_digest) is not None
    again = verify_registry(registry, trust=None, quarantine=True)
    assert again.exit_code == 0 and again.entries == 1
