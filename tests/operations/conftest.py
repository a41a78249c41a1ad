"""The operations suite: prebake in the hands of operators, cron jobs and impatient clients.

Each test is one scenario, run as an operator would: real `prebake` processes on a real store
and a real registry (a folder, or S3 through moto's server and a fault proxy). It is counted in
the fault suite's summary line (tests/support/scenarios.py) as the "operations" group, and every
registry and store it registered is re-checked when it ends.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.moto_server import moto_server, s3_env
from tests.support.scenarios import Scenario


@pytest.fixture(autouse=True)
def _checked(scenario: Scenario) -> Scenario:
    return scenario


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def bucket(moto, monkeypatch) -> str:
    """A fresh bucket on the module's moto server; this process's boto3 points at it."""
    import boto3

    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_env(moto).items():
        monkeypatch.setenv(name, value)
    name = f"ops-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name
