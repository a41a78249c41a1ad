"""Store problems speak of the store: a PREBAKE_HOME that cannot serve is one exit code (5) from
every command that uses the store, naming PREBAKE_HOME, what is wrong and the fix; a read-only
home still serves the commands that only read."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.errors import ExitCode
from prebake.engine.cli import build_parser, main

PREBAKE = str(Path(sys.executable).parent / "prebake")

# The fewest words that run each command that uses the store (its positional and required options).
ARGV = {
    "bake": ["bake", "--model", "tiny-llama"],
    "plan": ["plan", "--model", "tiny-llama"],
    "ls": ["ls"],
    "verify": ["verify"],
    "gc": ["gc"],
    "stats": ["stats"],
    "store ls": ["store", "ls"],
    "store verify": ["store", "verify"],
    "store rm": ["store", "rm", "tiny-llama"],
    "store gc": ["store", "gc"],
    "store stats": ["store", "stats"],
    "fetch": ["fetch", "--model", "tiny-llama"],
    "serve": ["serve", "--model", "tiny-llama", "--port", "0"],
    "promote": ["promote", "--list"],
    "kernel-cache": ["kernel-cache", "--model", "tiny-llama", "--to", "oci://127.0.0.1:9/kc:tag"],
    "copy": ["copy", "/no/such/prebake/staging", "/no/such/prebake/production"],
}
READERS = ("stats", "store ls", "ls", "store stats", "store verify", "plan", "verify")


def _commands_using_the_store() -> set[str]:
    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{prefix} {name}".strip())
        if parser.get_default("store_use") is not None:
            found.add(prefix)

    walk(build_parser(), "")
    return found


def test_every_command_that_uses_the_store_is_checked_here():
    assert _commands_using_the_store() == set(ARGV)


@pytest.mark.parametrize("command", sorted(ARGV))
def test_a_home_that_is_a_file_is_exit_5_naming_prebake_home(command, tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("PREBAKE_HOME", str(home))
    monkeypatch.delenv("PREBAKE_REGISTRY", raising=False)
    assert main(ARGV[command]) == ExitCode.STORE
    err = capsys.readouterr().err
    assert f"PREBAKE_HOME={home} is a file, not a folder; point PREBAKE_HOME at a folder" in err


@pytest.mark.parametrize("inner", ["index", "stats", "locks", "registry"])
def test_a_file_where_the_store_keeps_a_folder_is_named(inner, tmp_path, monkeypatch, capsys):
    (tmp_path / inner).write_text("x")
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path))
    assert main(["store", "stats"]) == ExitCode.STORE
    assert f"{tmp_path / inner} is a file where the store keeps a folder" in capsys.readouterr().err


def test_the_json_error_object_carries_the_store_exit_code(tmp_path, monkeypatch, capsys):
    import json

    (tmp_path / "home").write_text("x")
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    assert main(["store", "ls", "--json"]) == ExitCode.STORE
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == 5 and error["type"] == "StoreHomeError" and "PREBAKE_HOME" in error["message"]


# -- a read-only home: a real read-only bind mount (root), or a folder without write permission ---------


def _read_only(home: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREBAKE_HOME": str(home), "PREBAKE_TRUSTED_KEYS": ""}
    env.pop("PREBAKE_REGISTRY", None)
    words = [PREBAKE, *argv]
    if os.geteuid() != 0:  # permissions stop a user: the folder made unwritable is a read-only home
        home.chmod(0o555)
        try:
            return subprocess.run(words, env=env, capture_output=True, text=True, timeout=120)
        finally:
            home.chmod(0o755)
    if shutil.which("unshare") is None:
        pytest.skip("root without unshare(1): no way to make a read-only home here")
    mount = f'mount --bind {home} {home} && mount -o remount,bind,ro {home} && exec "$@"'
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", mount, "sh", *words], env=env, capture_output=True, text=True, timeout=120
    )
    if "mount" in done.stderr and done.returncode != 0 and "prebake" not in done.stderr:
        pytest.skip(f"cannot make a read-only mount here: {done.stderr.strip()}")
    return done


@pytest.fixture
def used_home(tmp_path) -> Path:
    """A home that has been used: stats recorded, the embedded registry there."""
    home = tmp_path / "home"
    env = {**os.environ, "PREBAKE_HOME": str(home), "PREBAKE_TRUSTED_KEYS": ""}
    env.pop("PREBAKE_REGISTRY", None)
    (home / "registry").mkdir(parents=True)
    done = subprocess.run(
        [PREBAKE, "fetch", "--model", "tiny-llama", "--precision", "fp32"], env=env, capture_output=True, text=True
    )
    assert done.returncode == ExitCode.MISS, done.stderr
    return home


@pytest.mark.parametrize("argv", [["stats"], ["store", "ls"], ["ls"], ["store", "stats", "--json"]], ids=" ".join)
def test_read_only_commands_work_on_a_read_only_home(used_home, argv):
    done = _read_only(used_home, argv)
    assert done.returncode == 0, done.stderr


def test_stats_on_a_read_only_home_shows_what_was_recorded(used_home):
    done = _read_only(used_home, ["store", "stats"])
    assert done.returncode == 0 and "0 event(s)" not in done.stdout, done.stdout + done.stderr


def test_a_fetch_on_a_read_only_home_reads_it_and_says_once_that_it_is_read_only(used_home):
    """A read-only store serves what it holds (docs/trust-and-failure.md, "Volumes"): this one holds
    nothing, so the fetch misses as it would anywhere, after one line saying the store is read-only."""
    done = _read_only(used_home, ["fetch", "--model", "tiny-llama", "--precision", "fp32"])
    assert done.returncode == ExitCode.MISS, done.stderr
    said = [line for line in done.stderr.splitlines() if "is read-only" in line]
    assert len(said) == 1 and str(used_home) in said[0], done.stderr
