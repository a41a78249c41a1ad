"""A registry address that names nothing is an error, on every scheme, not an empty registry.

Only the commands that write (bake, publish; the embedded default registry) create a folder; the
Hub stand-in is the small local server in tests/support (no real Hub is reached); S3 is moto's
server process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from prebake.artifacts.errors import ExitCode
from prebake.artifacts.ports.errors import RegistryNotFound
from prebake.engine.cli import main
from prebake.registry import open_registry
from prebake.registry.address import join_addresses, split_addresses
from prebake.registry.backends.file import FileRegistry
from tests.support.bundles import make_bundle

ROOT = Path(__file__).resolve().parents[2]


def _missing(scheme: str, tmp_path: Path, request) -> str:
    if scheme == "file":
        return str(tmp_path / "no-such-registry")
    if scheme == "s3":
        request.getfixturevalue("s3_client")
        return "s3://no-such-prebake-bucket/team"
    if scheme == "oci":
        return request.getfixturevalue("oci").address("team/no-such-repo")
    request.getfixturevalue("hub")
    return "hf://team/no-such-repo"


SCHEMES = ("file", "s3", "hf", "oci")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_registry_that_does_not_exist_is_an_error_when_read(scheme, tmp_path, request):
    address = _missing(scheme, tmp_path, request)
    with pytest.raises(RegistryNotFound, match="does not exist"):
        open_registry(address, create=False).lookup("graphs", "0" * 64)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("command", [["ls"], ["verify"], ["plan", "--model", "tiny-llama"]])
def test_every_reading_command_refuses_a_registry_that_does_not_exist(scheme, command, tmp_path, request, capsys):
    address = _missing(scheme, tmp_path, request)
    os.environ["PREBAKE_HOME"] = str(tmp_path / "home")
    try:
        code = main([*command, "--registry", address])
    finally:
        del os.environ["PREBAKE_HOME"]
    out, err = capsys.readouterr()
    assert code == ExitCode.INVALID, out + err
    assert "does not exist" in err and "no bundles" not in out and "0 entries" not in out


def test_fetch_refuses_a_misspelt_folder_instead_of_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    (tmp_path / "bundles").mkdir()
    code = main(["fetch", "--model", "tiny-llama", "--precision", "fp32", "--registry", str(tmp_path / "bundle")])
    err = capsys.readouterr().err
    assert code == ExitCode.INVALID and f"did you mean {tmp_path / 'bundles'}?" in err


def test_an_oci_repository_not_there_yet_reads_as_empty_when_publishing_creates_it(request, tmp_path):
    address = request.getfixturevalue("oci").address(f"team/first-{uuid.uuid4().hex[:10]}")
    registry = open_registry(address, create=True)
    assert registry.lookup("graphs", "0" * 64) is None and list(registry.list()) == []
    bundle = make_bundle(tmp_path / "bake")
    assert registry.publish(bundle.manifest, bundle.blob).created
    assert open_registry(address, create=False).lookup("graphs", bundle.manifest.key_digest) == bundle.manifest


def test_the_embedded_default_registry_reads_as_empty_before_the_first_bake(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path))
    monkeypatch.delenv("PREBAKE_REGISTRY", raising=False)
    assert main(["ls"]) == 0
    assert "no bundles in" in capsys.readouterr().out


def test_a_file_where_a_registry_folder_should_be_is_named(tmp_path):
    (tmp_path / "reg").write_text("not a folder")
    with pytest.raises(RegistryNotFound, match="is a file, not a folder"):
        open_registry(str(tmp_path / "reg"), create=False)


def test_bake_creates_the_folder_it_publishes_into(tmp_path):
    registry = open_registry(str(tmp_path / "new"), create=True)
    assert isinstance(registry, FileRegistry) and registry.lookup("graphs", "0" * 64) is None


# -- address lists -------------------------------------------------------------------------------


def test_an_existing_folder_with_a_comma_in_its_name_is_one_registry(tmp_path):
    folder = tmp_path / "team,a"
    folder.mkdir()
    registry = open_registry(str(folder), create=False)
    assert isinstance(registry, FileRegistry) and registry.root == folder


def test_a_comma_list_whose_member_is_missing_says_it_was_split(tmp_path):
    with pytest.raises(RegistryNotFound) as caught:
        open_registry(f"{tmp_path}/team,a", create=False)
    assert "read as a chain of 2 registries" in "\n".join(caught.value.__notes__)


@pytest.mark.parametrize("members", [["/a"], ["/a", "s3://b/p"], ["/data/x,y", "hf://o/r"], ["/p,q,r", "/s"]], ids=str)
def test_an_address_list_round_trips_through_its_escaped_form(members):
    assert split_addresses(join_addresses(members)) == members


def test_repeated_registry_flags_make_a_chain_and_never_split_a_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    near, far = tmp_path / "near,one", tmp_path / "far"
    near.mkdir(), far.mkdir()
    assert main(["ls", "--json", "--registry", str(near), "--registry", str(far)]) == 0
    shown = json.loads(capsys.readouterr().out)["registry"]
    assert shown.startswith(f"file://{near}") and shown.endswith(f"file://{far}")


def test_prebake_ls_help_documents_the_repeated_flag():
    done = subprocess.run(
        [sys.executable, "-m", "prebake.engine.cli", "ls", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "repeat the flag" in done.stdout


def test_a_typo_in_a_parent_folder_is_named_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    (tmp_path / "bundles" / "registry").mkdir(parents=True)
    assert main(["ls", "--registry", str(tmp_path / "bundle" / "registry")]) == ExitCode.INVALID
    assert f"did you mean {tmp_path / 'bundles' / 'registry'}?" in capsys.readouterr().err
