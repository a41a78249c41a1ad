"""The S3 fixtures the scenario suites share (tests/faults, tests/operations import them into their
conftest): one moto server per test module, a fresh bucket per test with this process's boto3
pointed at it."""

from __future__ import annotations

import uuid

import pytest

from tests.support.moto_server import moto_server, s3_env


@pytest.fixture(scope="module")
def moto():
    """moto's S3 server, one per test module that asks for it."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def bucket(moto, monkeypatch) -> str:
    """A fresh bucket on the module's moto server; this process's boto3 points at the server."""
    import boto3

    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_env(moto).items():
        monkeypatch.setenv(name, value)
    name = f"scenario-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name
