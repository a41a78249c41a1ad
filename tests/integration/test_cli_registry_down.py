"""A registry that is down is not a miss: `prebake fetch` exits 4 with advice about the endpoint,
the credentials and --registry-timeout; 3 stays "nothing matches". Real `prebake` processes
against loopback endpoints: a port nobody listens on, and a socket that accepts and never answers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from prebake.artifacts.errors import ExitCode
from tests.support.azurite_server import Azurite
from tests.support.moto_server import s3_env
from tests.support.ports import free_port

PREBAKE = str(Path(sys.executable).parent / "prebake")


@contextmanager
def black_hole() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel's backlog) and never answers a byte."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def _fetch(
    tmp_path: Path, endpoint: str, *extra: str, registry: str = "s3://prebake-team/bundles", env: dict | None = None
):
    env = {
        **os.environ,
        **s3_env(endpoint),
        "PREBAKE_HOME": str(tmp_path / "home"),
        "PREBAKE_TRUSTED_KEYS": "",
        "AWS_MAX_ATTEMPTS": "1",
        **(env or {}),
    }
    argv = [PREBAKE, "fetch", "--model", "tiny-llama", "--precision", "fp32", "--registry", registry, *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_a_down_endpoint_exits_4_with_advice_not_the_bake_advice(tmp_path):
    done = _fetch(tmp_path, f"http://127.0.0.1:{free_port()}", "--registry-timeout", "20")
    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
    assert "AWS_ENDPOINT_URL" in done.stderr and "--registry-timeout" in done.stderr
    assert "doit bake" not in done.stderr


@pytest.mark.parametrize("flag", ["--registry-timeout", "--fetch-timeout"])
def test_fetch_takes_the_time_boxes_serve_takes(flag):
    from prebake.engine.cli import build_parser

    parser = build_parser()
    for command in ("fetch", "serve"):
        args = parser.parse_args([command, "--model", "tiny-llama", flag, "7"])
        assert getattr(args, flag.lstrip("-").replace("-", "_")) == 7.0


def test_a_hanging_endpoint_gives_up_within_the_registry_time_box(tmp_path):
    with black_hole() as endpoint:
        done = _fetch(tmp_path, endpoint, "--registry-timeout", "2", "--json")
    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
    data = json.loads(done.stdout)
    assert data["complete"] is False and all(m["unavailable"] for m in data["misses"])
    assert "did not answer within 2 s (--registry-timeout)" in done.stderr


def test_nothing_matching_in_a_reachable_registry_still_exits_3(tmp_path):
    (tmp_path / "empty").mkdir()
    done = _fetch(tmp_path, "http://127.0.0.1:9", registry=str(tmp_path / "empty"))
    assert done.returncode == ExitCode.MISS, done.stderr
    assert "doit bake model=tiny-llama precision=fp32" in done.stderr


@pytest.mark.parametrize(
    ("registry", "env", "named"),
    [
        (
            "oci://127.0.0.1:{port}/team/bundles",
            {"PREBAKE_OCI_PLAIN_HTTP": "127.0.0.1:{port}"},
            "PREBAKE_OCI_TIMEOUT_S",
        ),
        (
            "az://devstoreaccount1/prebake/bundles",
            {
                "AZURE_STORAGE_CONNECTION_STRING": Azurite(
                    "http://127.0.0.1:{port}/devstoreaccount1"
                ).connection_string()
            },
            "BlobEndpoint",
        ),
    ],
    ids=["oci", "azure"],
)
def test_a_down_registry_is_advised_by_its_own_settings_not_another_backends(tmp_path, registry, env, named):
    port = str(free_port())
    extra = {
        "PREBAKE_OCI_MAX_ATTEMPTS": "1",
        "PREBAKE_OCI_TIMEOUT_S": "2",
        "PREBAKE_AZURE_MAX_ATTEMPTS": "1",
        "PREBAKE_AZURE_TIMEOUT_S": "2",
        **{k: v.replace("{port}", port) for k, v in env.items()},
    }
    done = _fetch(tmp_path, "http://127.0.0.1:1", registry=registry.replace("{port}", port), env=extra)
    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
    assert named in done.stderr and "--registry-timeout" in done.stderr
    assert "AWS_ENDPOINT_URL" not in done.stderr and "HF_TOKEN" not in done.stderr, done.stderr
