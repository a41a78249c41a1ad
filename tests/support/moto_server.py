"""moto's S3 API server as a real process on loopback, for tests and benchmarks.

    with moto_server() as endpoint:            # "http://127.0.0.1:<free port>"
        env = s3_env(endpoint)                 # dummy credentials, no profile files
        ...                                    # boto3 and awscli talk HTTP to it

Nothing is patched in-process: the server is `python -m moto.server`, a separate process
that speaks the S3 REST API, so boto3's retries, multipart and ranged GETs all run for real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port


def s3_env(endpoint: str) -> dict[str, str]:
    """Environment that points boto3 and awscli at `endpoint` with dummy credentials, ignoring
    the user's ~/.aws files and the EC2 metadata service."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@contextmanager
def moto_server(start_timeout_s: float = 30.0) -> Iterator[str]:
    """Start moto's server on a free loopback port, wait until it answers, yield its endpoint."""
    with tempfile.TemporaryDirectory(prefix="moto-") as tmp:
        log_path = Path(tmp, "server.log")
        proc, endpoint = _start(log_path, start_timeout_s)
        try:
            yield endpoint
        finally:
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """Stop a server this process started, by its pid: terminate, then kill if it lingers."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _start(log_path: Path, timeout_s: float) -> tuple[subprocess.Popen, str]:
    for _ in range(3):  # the free port can be taken between choosing it and moto binding it
        port = free_port()
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        endpoint = f"http://127.0.0.1:{port}"
        if wait_until_up(proc, endpoint + "/moto-api/", timeout_s):
            return proc, endpoint
        proc.kill()
        proc.wait()
    raise RuntimeError(f"moto's server did not start; its log says:\n{log_path.read_text(errors='replace')[-2000:]}")


def wait_until_up(proc: subprocess.Popen, url: str, timeout_s: float) -> bool:
    """Whether the server `proc` answers `url` (any HTTP status) before `timeout_s`, and is still running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except urllib.error.HTTPError:
            return True  # it answered, even if with an error status
        except OSError:
            time.sleep(0.05)
    return False
