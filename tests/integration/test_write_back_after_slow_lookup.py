"""A cold start whose registry lookup ran out of its time box still writes back when the registry
answers after the build (the cause of a flaky test_serve case: on a loaded host the lookup shares
the process with torch's and Inductor's imports and a healthy local registry took 16.9 s to be
asked, so the cold start skipped its write-back and the next start compiled again).

A real `prebake serve --eager` (no torch.compile) against moto's S3 behind the fault proxy, whose
first index read is slower than the start's registry time box; every later one passes.
"""

from __future__ import annotations

import uuid

import pytest

from tests.faults.fault_proxy import Fault, fault_proxy
from tests.support.api_server import write_api_recipe
from tests.support.moto_server import moto_server, s3_env
from tests.support.serving import ServeProcess, serve_env


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


def test_a_lookup_that_ran_out_of_time_at_start_up_does_not_cost_the_write_back(moto, tmp_path, monkeypatch):
    import boto3

    for name, value in s3_env(moto).items():
        monkeypatch.setenv(name, value)
    bucket = f"slow-lookup-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    recipes = write_api_recipe(tmp_path / "recipes")
    with fault_proxy(moto) as proxy:
        proxy.inject(Fault("GET", "/prebake/", "slow", seconds=15.0, times=1))  # the lookup's first read
        env = serve_env(tmp_path / "home", recipes, PREBAKE_WRITE_BACK="index", **s3_env(proxy.url))
        server = ServeProcess(
            ["--model", "api-test", "--eager", "--registry", f"s3://{bucket}/prebake", "--registry-timeout", "4",
             "--write-back"],
            env,
        )  # fmt: skip
        try:
            server.wait_ready(600)
        finally:
            server.stop()
    assert "did not answer within 4 s (--registry-timeout)" in server.log
    assert "write-back: buckets: published, autotune: published" in server.log, server.log
    published = {o["Key"].split("/")[2] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
    assert {"buckets", "autotune"} <= published, published
