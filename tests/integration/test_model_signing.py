"""OpenSSF model signatures: a bake signs each bundle's tree with the model-signing library, the
library's own CLI verifies an installed tree with the public key (and refuses one whose files
differ), and a policy rule naming the key or a certificate chain accepts a bundle on it.

The bundles are tiny-llama's, seeded for this host's keys (tests/support/seeding.py: the buckets
tree is real, the others hold their declared outputs); no torch compile runs here."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from prebake.artifacts.layout import side_relpath
from prebake.artifacts.store.local import Store
from prebake.registry import open_registry
from prebake.registry.trust.model_signatures import (
    SIDE_NAME,
    Anchor,
    ModelSignatureError,
    ModelSigner,
    check_signature,
    model_signer_from_env,
    verify_tree,
)
from prebake.registry.trust.policy_file import PolicyError, load_policy
from prebake.registry.trust.signing import SigningKeyError
from tests.support.baking import Home
from tests.support.seeding import plan_here, seed

pytest.importorskip("model_signing", reason="the model-signing extra is not installed (it is part of [dev])")
CLI = str(Path(sys.executable).parent / "model_signing")
FETCH = ("fetch", "--model", "tiny-llama", "--precision", "bf16", "--json")


def ec_keypair(folder: Path, name: str) -> tuple[Path, Path, ec.EllipticCurvePrivateKey]:
    """A P-256 key pair as PEM files, as `openssl ecparam -name prime256v1 -genkey` and `openssl ec -pubout` write."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public, key


def _certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                key_cert_sign=ca,
                crl_sign=ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """tiny-llama's bundles, each with a model signature beside its blob, made through the
    composition root's reading of PREBAKE_MODEL_SIGNING_KEY."""
    root = tmp_path_factory.mktemp("model-signing")
    private, public, _ = ec_keypair(root / "keys", "models")
    signer = model_signer_from_env({"PREBAKE_MODEL_SIGNING_KEY": str(private)})
    assert signer is not None
    manifests = seed(root / "registry", root / "scratch", plan_here(), model_sign=signer.sign)
    return root, private, public, manifests


def _installed(root: Path, manifests: dict, tmp_path: Path, kind: str = "buckets") -> tuple[Path, bytes]:
    registry = open_registry(str(root / "registry"))
    tree = Store(tmp_path / "store").install(manifests[kind], registry).tree
    signature = (root / "registry" / side_relpath(manifests[kind].blob.digest, SIDE_NAME)).read_bytes()
    return tree, signature


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)


def test_every_bundle_has_a_model_signature_beside_its_blob_as_the_attestation_is(signed):
    root, _, _, manifests = signed
    for kind, manifest in manifests.items():
        path = root / "registry" / side_relpath(manifest.blob.digest, SIDE_NAME)
        document = json.loads(path.read_text())
        assert document["mediaType"].startswith("application/vnd.dev.sigstore.bundle"), kind
        assert "dsseEnvelope" in document and "publicKey" in document["verificationMaterial"], kind


def test_the_librarys_cli_verifies_an_installed_tree_with_the_public_key_and_refuses_a_changed_file(signed, tmp_path):
    root, _, public, manifests = signed
    tree, signature = _installed(root, manifests, tmp_path)
    (tmp_path / "model.sig").write_bytes(signature)
    ok = _cli("verify", "key", str(tree), "--signature", str(tmp_path / "model.sig"), "--public_key", str(public))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Verification succeeded" in ok.stdout + ok.stderr

    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    victim = sorted(p for p in copy.rglob("*") if p.is_file())[0]
    victim.chmod(0o644)
    victim.write_bytes(victim.read_bytes() + b" ")
    bad = _cli("verify", "key", str(copy), "--signature", str(tmp_path / "model.sig"), "--public_key", str(public))
    assert bad.returncode != 0
    assert "Signature mismatch" in bad.stdout + bad.stderr and victim.name in bad.stdout + bad.stderr
    with pytest.raises(ModelSignatureError, match=victim.name):
        verify_tree(copy, signature, Anchor("models", public))  # prebake's own call of the library says the same


def _policy(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text("version = 1\n" + body)
    return path


def test_a_policy_rule_naming_the_key_accepts_the_bundles_on_their_model_signatures_and_refuses_another_key(
    signed, tmp_path
):
    root, _, public, _ = signed
    shutil.copy(public, tmp_path / "models.pub")
    _, other, _ = ec_keypair(tmp_path, "other")
    right = _policy(
        tmp_path, "right", '[model_signing_keys.models]\npublic_key = "models.pub"\n[[rules]]\nmodel_signing = ["models"]\n'
    )  # fmt: skip
    wrong = _policy(
        tmp_path, "wrong", f'[model_signing_keys.other]\npublic_key = "{other}"\n[[rules]]\nmodel_signing = ["other"]\n'
    )  # fmt: skip
    home = Home(tmp_path / "node")
    argv = (*FETCH, "--registry", str(root / "registry"))

    refused = home.prebake(*argv, extra_env={"PREBAKE_POLICY": str(wrong)})
    assert refused.returncode == 2, refused.stderr
    reasons = [m["reason"] for m in json.loads(refused.stdout)["misses"]]
    assert reasons and all("its model signature is refused" in r and "does not verify" in r for r in reasons)

    accepted = home.prebake(*argv, extra_env={"PREBAKE_POLICY": str(right)})
    assert accepted.returncode == 0, accepted.stderr
    assert set(json.loads(accepted.stdout)["bundles"]) == {"buckets", "autotune", "graphs"}
    assert len(list((tmp_path / "node" / "home" / "side").rglob(SIDE_NAME))) == 3  # kept beside the store's trees


def test_a_signature_over_other_files_or_none_at_all_is_refused_before_anything_is_installed(signed, tmp_path):
    root, private, public, manifests = signed
    registry = tmp_path / "registry"
    shutil.copytree(root / "registry", registry)
    # An attacker with a genuine signature by the key, over a tree with one file changed, puts it beside
    # the graphs blob (and removes the autotune bundle's signature).
    tree, _ = _installed(root, manifests, tmp_path, "graphs")
    other = tmp_path / "other-tree"
    shutil.copytree(tree, other)
    victim = sorted(p for p in other.rglob("*") if p.is_file())[0]
    victim.chmod(0o644)
    victim.write_text("something else")
    side = registry / side_relpath(manifests["graphs"].blob.digest, SIDE_NAME)
    side.chmod(0o644)
    side.write_bytes(ModelSigner(private).sign(other))
    (registry / side_relpath(manifests["autotune"].blob.digest, SIDE_NAME)).unlink()
    shutil.copy(public, tmp_path / "models.pub")
    policy = _policy(
        tmp_path, "policy", '[model_signing_keys.models]\npublic_key = "models.pub"\n[[rules]]\nmodel_signing = ["models"]\n'
    )  # fmt: skip

    done = Home(tmp_path / "node").prebake(
        *FETCH, "--registry", str(registry), extra_env={"PREBAKE_POLICY": str(policy)}
    )

    assert done.returncode == 2, done.stderr
    misses = {m["kind"]: m["reason"] for m in json.loads(done.stdout)["misses"]}
    assert "verifies, but 1 file(s) differ" in misses["graphs"] and victim.name in misses["graphs"]
    assert "requires an OpenSSF model signature" in misses["autotune"] and "there is none" in misses["autotune"]
    assert not (tmp_path / "node" / "home" / "trees").exists() or not any(
        (tmp_path / "node" / "home" / "trees").rglob(victim.name)
    )


def test_certificate_mode_signs_offline_and_verifies_against_the_chain_with_the_cli_and_the_policy(signed, tmp_path):
    root, _, _, manifests = signed
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("prebake test CA", ca_key, "prebake test CA", ca_key, ca=True)
    leaf_private, _, leaf_key = ec_keypair(tmp_path, "leaf")
    leaf = _certificate("models team", leaf_key, "prebake test CA", ca_key, ca=False)
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "leaf.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    env = {
        "PREBAKE_MODEL_SIGNING_KEY": str(leaf_private),
        "PREBAKE_MODEL_SIGNING_CERT": str(tmp_path / "leaf.crt"),
        "PREBAKE_MODEL_SIGNING_CHAIN": str(tmp_path / "ca.pem"),
    }
    signer = model_signer_from_env(env)
    assert signer is not None and signer.certificate is not None
    tree, _ = _installed(root, manifests, tmp_path)
    signature = signer.sign(tree)
    (tmp_path / "model.sig").write_bytes(signature)

    ok = _cli("verify", "certificate", str(tree), "--signature", str(tmp_path / "model.sig"),
              "--certificate_chain", str(tmp_path / "ca.pem"))  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (
        check_signature(signature, [Anchor("team-ca", None, (tmp_path / "ca.pem",))], manifests["buckets"]) == "team-ca"
    )
    stranger = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "stranger.pem").write_bytes(
        _certificate("stranger", stranger, "stranger", stranger, ca=True).public_bytes(serialization.Encoding.PEM)
    )
    with pytest.raises(ModelSignatureError, match="does not verify"):
        check_signature(signature, [Anchor("stranger", None, (tmp_path / "stranger.pem",))], manifests["buckets"])


def test_bad_settings_and_policies_are_refused_naming_the_fix(tmp_path):
    with pytest.raises(SigningKeyError, match="PREBAKE_MODEL_SIGNING_KEY"):
        model_signer_from_env({"PREBAKE_MODEL_SIGNING_CERT": "/x.crt"})
    with pytest.raises(SigningKeyError, match="is not a file"):
        model_signer_from_env({"PREBAKE_MODEL_SIGNING_KEY": str(tmp_path / "absent.pem")})
    ed = tmp_path / "ed.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(ed)], check=True, capture_output=True)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "f").write_text("x")
    with pytest.raises(SigningKeyError, match="P-256, P-384 or P-521"):
        ModelSigner(ed).sign(tmp_path / "tree")
    undefined = _policy(tmp_path, "undefined", '[[rules]]\nmodel_signing = ["nobody"]\n')
    with pytest.raises(PolicyError, match="model signing key 'nobody'"):
        load_policy(undefined)
    both = _policy(
        tmp_path, "both", '[model_signing_keys.k]\npublic_key = "a.pub"\ncertificate_chain = ["ca.pem"]\n'
        '[[rules]]\nmodel_signing = ["k"]\n'
    )  # fmt: skip
    with pytest.raises(PolicyError, match="either public_key or certificate_chain"):
        load_policy(both)
    provenance = _policy(
        tmp_path, "provenance", '[model_signing_keys.k]\npublic_key = "a.pub"\n'
        '[[rules]]\nmodel_signing = ["k"]\nrequire_provenance = true\n'
    )  # fmt: skip
    with pytest.raises(PolicyError, match="requires provenance names the keys"):
        load_policy(provenance)
