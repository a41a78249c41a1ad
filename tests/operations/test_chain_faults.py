"""A chain survives a member that hangs or faults: the member is skipped for the rest of the run and
the next one answers within the same time box; a folder that is a link loop is a registry fault;
`prebake verify` of a registry it cannot see fails."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from tests.operations.target import KINDS, fetch_args, prebake, prebake_env, published_set
from tests.support.moto_server import s3_env
from tests.support.ports import free_port

EXIT_INVALID, EXIT_MISS = 2, 3


@pytest.fixture
def folder(tmp_path, scenario):
    """A folder registry holding tiny-llama's whole set: the chain's second member."""
    return published_set(tmp_path, scenario)


class _Silent:
    """A loopback server that accepts every connection and never answers (a hung S3 endpoint)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def _fetched(got, targets) -> dict:
    assert got.returncode == 0, got.stderr
    payload = json.loads(got.stdout)
    assert payload["complete"] and sorted(payload["bundles"]) == sorted(KINDS), payload
    assert all(payload["bundles"][k]["blob"] == targets.manifests[k].blob.digest for k in KINDS)
    return payload


def test_a_first_member_that_accepts_and_never_answers_is_skipped_and_the_folder_answers(tmp_path, folder):
    registry, targets = folder
    silent = _Silent()
    try:
        env = prebake_env(tmp_path / "home", **s3_env(silent.endpoint))
        got = prebake(*fetch_args(f"s3://prebake/hangs,{registry.root}", "--json"), env=env, timeout=120)
    finally:
        silent.close()
    _fetched(got, targets)  # within fetch's one time box: a member asked for every kind would exhaust it
    assert got.stderr.count("skipped for the rest of this run") == 1, got.stderr
    assert "did not answer" not in got.stdout


def test_a_first_member_that_refuses_connections_is_asked_once_and_the_folder_answers(tmp_path, folder):
    registry, targets = folder
    env = prebake_env(tmp_path / "home", **s3_env(f"http://127.0.0.1:{free_port()}"), PREBAKE_S3_MAX_ATTEMPTS="1")
    got = prebake(*fetch_args(f"s3://prebake/down,{registry.root}", "--json"), env=env)
    _fetched(got, targets)
    assert got.stderr.count("skipped for the rest of this run") == 1, got.stderr


@pytest.fixture
def loop(tmp_path):
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    return tmp_path / "loop-a"


def test_a_registry_folder_that_is_a_link_loop_is_a_wrong_address_named_as_a_loop(tmp_path, folder, loop):
    """A loop is not "this entry is a link" and not an empty registry: the address is refused, naming
    the loop (issue 24: a registry address that names nothing is an error, in a chain too)."""
    registry, _targets = folder
    for address in (str(loop), f"{loop},{registry.root}"):
        got = prebake(*fetch_args(address, "--json"), env=prebake_env(tmp_path / "home"))
        assert got.returncode == EXIT_INVALID, got.stderr
        assert "is a link" not in got.stderr and "Too many levels of symbolic links" in got.stderr, got.stderr


def _missing(tmp_path):
    return tmp_path / "no-such-registry", "does not exist"


def _a_file(tmp_path):
    (tmp_path / "a-file").write_text("a file where the registry folder should be")
    return tmp_path / "a-file", "is a file, not a folder"


def _a_loop(tmp_path):
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    return tmp_path / "loop-a", "Too many levels of symbolic links"


@pytest.mark.parametrize("where", [_missing, _a_file, _a_loop], ids=["missing", "a-file", "link-loop"])
def test_verify_of_a_registry_it_cannot_see_fails_instead_of_reporting_zero_entries(tmp_path, where):
    address, why = where(tmp_path)
    for args in (["verify", "--registry", str(address)], ["verify", "--deep", "--registry", str(address)]):
        got = prebake(*args, env=prebake_env(tmp_path / "home"))
        assert got.returncode == EXIT_INVALID, (got.stdout, got.stderr)
        assert why in got.stderr and "0 entries" not in got.stdout, got.stderr


def test_verify_of_an_empty_registry_folder_still_reports_zero_entries(tmp_path):
    (tmp_path / "empty").mkdir()
    got = prebake("verify", "--registry", str(tmp_path / "empty"), env=prebake_env(tmp_path / "home"))
    assert got.returncode == 0 and "0 entries" in got.stdout, got.stderr
