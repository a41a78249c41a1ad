"""A bake's provenance (issue 22, point 2): an in-toto Statement with the SLSA provenance v1
predicate about the bundle's blob, sealed in DSSE with the bake's key, beside the blob.

The published attestation is checked with the maintained libraries' own verifiers:
securesystemslib's `Envelope.verify` for the DSSE signature and in_toto_attestation's
`Statement.validate` for the Statement; prebake's own reader is tested against them.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from prebake.artifacts.bake.bake_kind import bake_kind
from prebake.artifacts.bake.provenance import PAYLOAD_TYPE, PREDICATE_TYPE, SIDE_NAME, read_statement, recipe_digest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.store.local import Store
from prebake.engine.common.builder import attester, builder_id, source_revision
from prebake.engine.common.probe import current_host
from prebake.registry.backends.file import FileRegistry
from prebake.registry.trust.attestation import AttestationError, check_attestation, seal
from prebake.registry.trust.signing import KeySigner, PublicKey, load_private_key, write_keypair
from tests.support.seeding import plan_here


@pytest.fixture(scope="module")
def fleet_key(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    private, public = write_keypair("fleet-ci", folder)
    return KeySigner("fleet-ci", load_private_key(private)), PublicKey.parse(public.read_text())


@pytest.fixture(scope="module")
def baked(tmp_path_factory, fleet_key):
    """buckets of tiny-llama baked for real with an attester, into a folder registry."""
    signer, _public = fleet_key
    root = tmp_path_factory.mktemp("prov")
    registry = FileRegistry(root / "registry")
    plan = plan_here()
    env = {"PREBAKE_BUILDER_ID": "https://github.com/acme/models/.github/workflows/bake.yml@refs/heads/main"}
    attest = attester(signer, current_host(), env)
    baked = bake_kind(plan, "buckets", store=Store(root / "home"), registry=registry, sign=signer, attest=attest)
    return plan, registry, baked.manifest


def test_the_published_attestation_verifies_with_securesystemslib_and_validates_with_in_toto(baked, fleet_key):
    plan, registry, manifest = baked
    raw = registry.get_side(manifest.blob.digest, SIDE_NAME)
    assert raw is not None, "the bake published no attestation beside the blob"
    envelope = Envelope.from_dict(json.loads(raw))
    assert envelope.payload_type == PAYLOAD_TYPE == "application/vnd.in-toto+json"
    public = Ed25519PublicKey.from_public_bytes(fleet_key[1].raw)
    verified = envelope.verify([SSlibKey.from_crypto(public, keyid="fleet-ci")], 1)  # the library's verifier
    assert set(verified) == {"fleet-ci"}
    document = Statement.copy_from_pb(json_format.Parse(envelope.payload, statement_pb2.Statement()))
    document.validate()  # in-toto's own validation
    as_json = json.loads(envelope.payload)
    assert as_json["_type"] == "https://in-toto.io/Statement/v1" and as_json["predicateType"] == PREDICATE_TYPE
    assert as_json["subject"] == [
        {"name": f"buckets/{manifest.key_digest}.tar.zst", "digest": {"sha256": manifest.blob.hex}}
    ]
    predicate = as_json["predicate"]
    assert predicate["runDetails"]["builder"]["id"].startswith("https://github.com/acme/models/")
    deps = {d["name"]: d for d in predicate["buildDefinition"]["resolvedDependencies"]}
    assert deps["recipe:tiny-llama"]["digest"] == {"sha256": recipe_digest(plan.recipe)}
    host = current_host()
    assert deps["torch"]["uri"] == f"pkg:pypi/torch@{host.software.torch}"
    assert deps["python"]["annotations"]["version"] == host.software.python
    assert deps["prebake"]["annotations"]["version"] == "0.1.0"
    assert deps["platform"]["annotations"] == host.platform.factors()
    assert predicate["buildDefinition"]["externalParameters"]["target"] == plan.target.name


def test_a_checkout_names_its_source_revision_without_credentials(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(
        ["git", "-C", str(tmp_path), "remote", "add", "origin", "https://bot:s3cret@github.com/acme/models.git"],
        check=True,
    )
    subprocess.run(
        ["git", "-C", str(tmp_path), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty",
         "-m", "x"],
        check=True,
    )  # fmt: skip
    source = source_revision({}, tmp_path)
    assert source is not None and source.uri == "git+https://github.com/acme/models.git"
    assert len(source.commit) == 40 and "s3cret" not in source.uri
    import tempfile

    with tempfile.TemporaryDirectory() as bare:  # not a checkout: no source, never an error
        assert source_revision({}, Path(bare)) is None
    ci = {"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/models", "GITHUB_SHA": "a" * 40}
    assert source_revision(ci, tmp_path).commit == "a" * 40  # type: ignore[union-attr]
    wf = {"GITHUB_ACTIONS": "true", "GITHUB_WORKFLOW_REF": "acme/models/.github/workflows/bake.yml@refs/heads/main"}
    assert builder_id(wf) == "https://github.com/acme/models/.github/workflows/bake.yml@refs/heads/main"


def test_prebakes_reader_agrees_with_the_statement(baked, fleet_key):
    _plan, registry, manifest = baked
    provenance = check_attestation(registry.get_side(manifest.blob.digest, SIDE_NAME), [fleet_key[1]], manifest)
    assert provenance.subject_digest == manifest.blob.digest
    assert provenance.dependencies["torch"] == current_host().software.torch
    assert provenance.finished is not None and provenance.build_type.endswith("#bake-v1")


def test_an_attestation_whose_subject_is_another_blob_is_refused(baked, fleet_key, tmp_path):
    _plan, registry, manifest = baked
    other = manifest.model_copy(update={"blob": manifest.blob.model_copy(update={"digest": "sha256:" + "0" * 64})})
    with pytest.raises(AttestationError, match="about blob sha256:.*not this bundle's.*another bundle"):
        check_attestation(registry.get_side(manifest.blob.digest, SIDE_NAME), [fleet_key[1]], other)


def test_an_attestation_by_another_key_or_edited_after_sealing_is_refused(baked, fleet_key, tmp_path):
    _plan, registry, manifest = baked
    raw = registry.get_side(manifest.blob.digest, SIDE_NAME)
    private, public = write_keypair("fleet-ci", tmp_path)  # same name, another key: an impostor
    impostor = PublicKey.parse(public.read_text())
    with pytest.raises(AttestationError, match="does not verify against a trusted key"):
        check_attestation(raw, [impostor], manifest)
    envelope = json.loads(raw)
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["predicate"]["runDetails"]["builder"]["id"] = "https://evil.example/builder"
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    with pytest.raises(AttestationError, match="does not verify"):
        check_attestation(json.dumps(envelope).encode(), [fleet_key[1]], manifest)
    with pytest.raises(VerificationError):  # and securesystemslib agrees
        Envelope.from_dict(envelope).verify(
            [SSlibKey.from_crypto(Ed25519PublicKey.from_public_bytes(fleet_key[1].raw), keyid="fleet-ci")], 1
        )


def test_garbage_in_place_of_an_attestation_is_a_clear_refusal(fleet_key, baked):
    _plan, _registry, manifest = baked
    for raw in (
        b"not json",
        b"{}",
        json.dumps({"payload": "", "payloadType": "text/plain", "signatures": []}).encode(),
    ):
        with pytest.raises(AttestationError):
            check_attestation(raw, [fleet_key[1]], manifest)
    sealed = seal(b'{"_type": "something else"}', fleet_key[0].key, "fleet-ci")
    with pytest.raises(AttestationError, match="not an in-toto v1 SLSA provenance statement"):
        check_attestation(sealed, [fleet_key[1]], manifest)
    with pytest.raises(BundleError, match="not an in-toto v1"):
        read_statement(base64.b64decode(json.loads(sealed)["payload"]))
