"""Signing and trust: real ed25519 keys, real packed bundles, real files."""

from __future__ import annotations

import base64
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from prebake.artifacts.bundle.manifest import BlobRef, FileEntry, Manifest, Signature
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.keys import Key
from prebake.artifacts.store.local import Store
from prebake.registry.backends.file import FileRegistry
from prebake.registry.trust.signing import (
    SigningKeyError,
    TrustPolicy,
    generate_keypair,
    keygen_cli,
    load_private_key,
    sign,
    signer_from_env,
    trust_from_env,
    write_keypair,
)

REPO = Path(__file__).resolve().parents[2]
GROUPS = {"software": {"torch": "2.13.0+cpu"}, "platform": {"arch": "x86_64"}}


def make_bundle(tmp: Path, groups=GROUPS, content: bytes = b"kernel") -> tuple[Manifest, Path]:
    tree = tmp / "tree"
    tree.mkdir(parents=True)
    (tree / "kernels.bin").write_bytes(content)
    (tree / "sub").mkdir()
    (tree / "sub" / "plan.json").write_text('{"buckets": [1, 8]}')
    packed = pack(tree, tmp / "payload.tar.zst", threads=1)
    manifest = Manifest(
        kind="graphs",
        key=groups,
        key_digest=Key.of("graphs", groups).digest,
        labels={"model": "tiny-llama"},
        blob=packed.blob,
        files=packed.files,
        inputs={"buckets": "sha256:" + "1" * 64},
        created="2026-01-01T00:00:00+00:00",
        builder="test",
    )
    return manifest, tmp / "payload.tar.zst"


def keypair(name: str):
    pem, line = generate_keypair(name)
    return load_pem_private_key(pem, password=None), line


@pytest.fixture
def manifest(tmp_path) -> Manifest:
    return make_bundle(tmp_path)[0]


# -- signing and the trust policy ------------------------------------------------------------


def test_signed_manifest_verifies_against_the_trusted_public_key(manifest):
    key, line = keypair("ci")
    signed = sign(manifest, key, "ci")
    assert [s.signer for s in signed.signatures] == ["ci"]
    assert TrustPolicy.from_lines([line]).check(signed) is None


def test_signature_survives_a_round_trip_through_the_json_file(manifest, tmp_path):
    key, line = keypair("ci")
    path = tmp_path / "manifest.json"
    path.write_bytes(sign(manifest, key, "ci").to_bytes())
    assert TrustPolicy.from_lines([line]).check(Manifest.read(path)) is None


def test_resigning_replaces_the_same_signers_signature_and_keeps_others(manifest):
    ci, _ = keypair("ci")
    release, _ = keypair("release")
    once = sign(sign(manifest, ci, "ci"), release, "release")
    again = sign(once, ci, "ci")
    assert [s.signer for s in again.signatures] == ["release", "ci"]


def _edit_factor(m: Manifest) -> Manifest:
    groups = {**m.key, "software": {"torch": "2.14.1"}}
    return m.model_copy(update={"key": groups, "key_digest": Key.of(m.kind, groups).digest})


def _edit_blob_digest(m: Manifest) -> Manifest:
    return m.model_copy(update={"blob": BlobRef(digest="sha256:" + "e" * 64, size=m.blob.size)})


def _edit_blob_size(m: Manifest) -> Manifest:
    return m.model_copy(update={"blob": BlobRef(digest=m.blob.digest, size=m.blob.size + 1)})


def _edit_file_digest(m: Manifest) -> Manifest:
    first = m.files[0]
    forged = FileEntry(path=first.path, size=first.size, sha256="sha256:" + "f" * 64)
    return m.model_copy(update={"files": (forged,) + m.files[1:]})


def _edit_inputs(m: Manifest) -> Manifest:
    return m.model_copy(update={"inputs": {"buckets": "sha256:" + "2" * 64}})


@pytest.mark.parametrize("tamper", [_edit_factor, _edit_blob_digest, _edit_blob_size, _edit_file_digest, _edit_inputs])
def test_manifest_changed_after_signing_is_refused(manifest, tamper):
    key, line = keypair("ci")
    tampered = tamper(sign(manifest, key, "ci"))
    Manifest.parse(tampered.to_bytes(), "tampered")  # still a well-formed manifest: only the signature can tell
    reason = TrustPolicy.from_lines([line]).check(tampered)
    assert reason is not None
    assert reason.startswith("signature by ci does not verify: the manifest was changed after signing")


def test_signature_by_an_impostor_using_a_trusted_name_is_refused(manifest):
    _, line = keypair("ci")
    impostor, _ = keypair("ci")
    reason = TrustPolicy.from_lines([line]).check(sign(manifest, impostor, "ci"))
    assert reason is not None and "signature by ci does not verify" in reason


def test_unknown_signer_is_refused_naming_the_signer_and_the_trusted_keys(manifest):
    stranger, _ = keypair("stranger")
    _, a = keypair("a")
    _, b = keypair("b")
    reason = TrustPolicy.from_lines([b, a]).check(sign(manifest, stranger, "stranger"))
    assert reason is not None and reason.startswith("signed by unknown signer stranger (trusted: a, b)")


def test_unsigned_manifest_is_refused_when_keys_are_trusted(manifest):
    _, line = keypair("ci")
    reason = TrustPolicy.from_lines([line]).check(manifest)
    assert reason is not None and reason.startswith("unsigned")


def test_any_one_of_several_trusted_keys_is_enough(manifest):
    (a_key, a), (b_key, b), (c_key, _) = keypair("a"), keypair("b"), keypair("c")
    policy = TrustPolicy.from_lines([a, b])
    assert policy.check(sign(manifest, a_key, "a")) is None
    assert policy.check(sign(manifest, b_key, "b")) is None
    assert policy.check(sign(sign(manifest, c_key, "c"), b_key, "b")) is None
    assert policy.check(sign(manifest, c_key, "c")) is not None


@pytest.mark.parametrize("garbage", ["not base64!!", "", base64.b64encode(b"short").decode(), "é"])
def test_malformed_signature_is_a_reason_not_a_crash(manifest, garbage):
    _, line = keypair("ci")
    broken = manifest.model_copy(update={"signatures": (Signature(signer="ci", signature=garbage, version=2),)})
    reason = TrustPolicy.from_lines([line]).check(broken)
    assert reason is not None and "signature by ci does not verify" in reason


def test_two_different_keys_under_one_name_are_refused():
    _, first = keypair("ci")
    _, second = keypair("ci")
    with pytest.raises(SigningKeyError, match="both named 'ci'"):
        TrustPolicy.from_lines([first, second])


@pytest.mark.parametrize(
    "line",
    [
        "no-colon-here",
        "ci:not*base64",
        "ci:" + base64.b64encode(b"sixteen bytes!!!").decode(),
        ":" + base64.b64encode(b"\x01" * 32).decode(),
        "bad/name:" + base64.b64encode(b"\x01" * 32).decode(),
    ],
)
def test_malformed_public_key_line_is_a_clear_error(line):
    with pytest.raises(SigningKeyError, match="expected '<name>:<base64 of 32 bytes>'"):
        TrustPolicy.from_lines([line])


def test_refused_manifest_is_a_miss_and_nothing_is_installed(tmp_path):
    manifest, blob = make_bundle(tmp_path / "bake")
    key, line = keypair("ci")
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(_edit_file_digest(sign(manifest, key, "ci")), blob)
    store = Store(tmp_path / "store")

    got = fetch_key(store, registry, manifest.the_key(), trust=TrustPolicy.from_lines([line]).check)

    assert isinstance(got, Miss) and "does not verify" in got.reason
    assert not (tmp_path / "store" / "trees").exists()


# -- key files and the environment ----------------------------------------------------------


def test_keypair_files_private_is_0600_and_the_pair_signs_and_verifies(tmp_path, manifest):
    private, public = write_keypair("ci-1", tmp_path / "keys")
    assert (private.name, public.name) == ("ci-1.pem", "ci-1.pub")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    line = public.read_text().strip()
    assert line.startswith("ci-1:")
    signed = sign(manifest, load_private_key(private), "ci-1")
    assert TrustPolicy.from_lines([line]).check(signed) is None
    assert not [p for p in (tmp_path / "keys").iterdir() if p.name.startswith(".tmp-")]


def test_keygen_refuses_to_overwrite_an_existing_key(tmp_path):
    private, _ = write_keypair("ci", tmp_path)
    before = private.read_bytes()
    with pytest.raises(SigningKeyError, match="already exists"):
        write_keypair("ci", tmp_path)
    assert private.read_bytes() == before


def test_keygen_cli_says_where_the_keys_are_and_what_to_export(tmp_path):
    text = keygen_cli("ci", tmp_path)
    line = (tmp_path / "ci.pub").read_text().strip()
    assert str(tmp_path / "ci.pem") in text and line in text
    assert f"export PREBAKE_SIGNING_KEY={tmp_path / 'ci.pem'}" in text
    assert f"export PREBAKE_TRUSTED_KEYS={line}" in text


def test_signer_from_env_signs_as_the_key_files_name_or_the_given_name(tmp_path, manifest):
    private, public = write_keypair("ci", tmp_path)
    assert signer_from_env({}) is None
    by_stem = signer_from_env({"PREBAKE_SIGNING_KEY": str(private)})
    named = signer_from_env({"PREBAKE_SIGNING_KEY": str(private), "PREBAKE_SIGNING_KEY_NAME": "release"})
    assert [s.signer for s in by_stem(manifest).signatures] == ["ci"]
    assert [s.signer for s in named(manifest).signatures] == ["release"]
    trust = trust_from_env({"PREBAKE_TRUSTED_KEYS": str(public)})
    assert trust(by_stem(manifest)) is None
    assert repr(by_stem) == "KeySigner(name='ci')"  # the key never lands in a log line


def test_signer_from_env_with_a_missing_key_file_names_the_path_and_the_fix(tmp_path):
    missing = tmp_path / "nope.pem"
    with pytest.raises(SigningKeyError) as err:
        signer_from_env({"PREBAKE_SIGNING_KEY": str(missing)})
    assert isinstance(err.value, PrebakeError)
    assert str(missing) in str(err.value) and "prebake keygen" in str(err.value)


def test_signer_from_env_with_a_file_that_is_not_a_key_is_a_clear_error(tmp_path):
    junk = tmp_path / "ci.pem"
    junk.write_text("hello")
    with pytest.raises(SigningKeyError, match="not an unencrypted PEM private key"):
        signer_from_env({"PREBAKE_SIGNING_KEY": str(junk)})


def test_trusted_keys_from_env_as_separated_lines(manifest):
    (a_key, a), (b_key, b) = keypair("a"), keypair("b")
    for value in (f"{a},{b}", f"{a} {b}", f"  {a} ,\n{b}\n"):
        trust = trust_from_env({"PREBAKE_TRUSTED_KEYS": value})
        assert trust(sign(manifest, a_key, "a")) is None
        assert trust(sign(manifest, b_key, "b")) is None
        assert trust(manifest).startswith("unsigned")


def test_trusted_keys_from_env_as_a_file_with_comments(tmp_path, manifest):
    (a_key, a), (_, b) = keypair("a"), keypair("b")
    keys = tmp_path / "trusted"
    keys.write_text(f"# build farm\n{a}\n\n{b}\n")
    trust = trust_from_env({"PREBAKE_TRUSTED_KEYS": str(keys)})
    assert trust(sign(manifest, a_key, "a")) is None


def test_trusted_keys_naming_a_missing_file_or_a_bad_line_is_a_clear_error(tmp_path):
    missing = tmp_path / "trusted"
    with pytest.raises(SigningKeyError, match=str(missing)):
        trust_from_env({"PREBAKE_TRUSTED_KEYS": str(missing)})
    _, good = keypair("a")
    with pytest.raises(SigningKeyError, match="PREBAKE_TRUSTED_KEYS 'b:oops'"):
        trust_from_env({"PREBAKE_TRUSTED_KEYS": f"{good},b:oops"})


def test_without_trusted_keys_nothing_is_checked_and_the_warning_is_said_once_per_process():
    script = (
        "from prebake.registry.trust.signing import trust_from_env\n"
        "assert trust_from_env({}) is None\n"
        "assert trust_from_env({'PREBAKE_TRUSTED_KEYS': '  '}) is None\n"
        "assert trust_from_env({}) is None\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("UNVERIFIED") == 1
    assert "PREBAKE_TRUSTED_KEYS" in run.stderr and "prebake keygen" in run.stderr


def test_the_signature_covers_the_labels(manifest):
    key, line = keypair("ci")
    signed = sign(manifest, key, "ci")
    assert signed.signatures[0].version == 2
    relabelled = signed.model_copy(update={"labels": {"model": "something-else"}})
    reason = TrustPolicy.from_lines([line]).check(relabelled)
    assert reason is not None and "does not verify" in reason


def test_a_version_1_signature_is_refused_with_its_reason_unless_accepted(manifest):
    key, line = keypair("ci")
    old = Signature(signer="ci", signature=base64.b64encode(key.sign(manifest.signed_payload(1))).decode())
    signed = manifest.model_copy(update={"signatures": (old,)})
    assert Manifest.parse(signed.to_bytes(), "old").signatures[0].version == 1  # older manifests still parse
    reason = TrustPolicy.from_lines([line]).check(signed)
    assert reason is not None and "version 1 did not cover the labels" in reason and "ACCEPT_V1" in reason
    assert TrustPolicy.from_lines([line], accept_v1=True).check(signed) is None
    trust = trust_from_env({"PREBAKE_TRUSTED_KEYS": line, "PREBAKE_ACCEPT_V1_SIGNATURES": "1"})
    assert trust(signed) is None


def test_an_unknown_signature_version_is_refused_clearly(manifest):
    key, line = keypair("ci")
    future = Signature(signer="ci", signature=base64.b64encode(b"x" * 64).decode(), version=9)
    reason = TrustPolicy.from_lines([line]).check(manifest.model_copy(update={"signatures": (future,)}))
    assert reason is not None and "newer prebake" in reason
