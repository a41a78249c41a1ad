"""OpenSSF model signatures (the `model-signing` package) over a bundle's tree, beside its blob.

    model_signer_from_env(env)           PREBAKE_MODEL_SIGNING_KEY (+ _CERT, _CHAIN): the ModelSigner, or None
    ModelSigner.sign(tree)               the library's Sigstore bundle (a DSSE envelope over every file's sha256)
    SIDE_NAME ("model.sig")              the side file beside the blob (SideFiles), like the attestation
    verify_tree(tree, sig, anchor)       the library's own verification of an installed tree
    check_signature(sig, anchor, m)      at fetch, before any install: it verifies, and names exactly m's files

The signature verifies with the library's CLI on an installed tree, without prebake
(docs/trust.md, "OpenSSF model signatures"). Keys and certificates only: keyless Sigstore needs
the network. `model_signing` is imported where used: the optional extra `prebake[model-signing]`.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES
from prebake.registry.trust.signing import SigningKeyError

if TYPE_CHECKING:
    from model_signing import manifest as ms_manifest

SIDE_NAME = "model.sig"
KEY_ENV = "PREBAKE_MODEL_SIGNING_KEY"
CERT_ENV = "PREBAKE_MODEL_SIGNING_CERT"
CHAIN_ENV = "PREBAKE_MODEL_SIGNING_CHAIN"
_CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what the library signs with
_INSTALL = "install it with `pip install 'prebake[model-signing]'`"


class ModelSignatureError(BundleError):
    """A model signature is missing, malformed, not by the trusted key, or about other files."""


@dataclass(frozen=True)
class Anchor:
    """What verifies a model signature: a public key (PEM), or a certificate chain (PEMs) that the
    signing certificate embedded in the signature must lead to."""

    name: str
    public_key: Path | None = None
    certificate_chain: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if (self.public_key is None) == (not self.certificate_chain):
            raise SigningKeyError(
                f"model signing key {self.name}: give either public_key or certificate_chain, not both or neither"
            )

    def describe(self) -> str:
        if self.public_key is not None:
            return f"{self.name} (public key {self.public_key})"
        return f"{self.name} (certificate chain {', '.join(map(str, self.certificate_chain))})"


@dataclass(frozen=True)
class ModelSigner:
    """Signs a tree with the library's key signer, or its certificate signer when a certificate is given."""

    private_key: Path
    certificate: Path | None = None
    chain: tuple[Path, ...] = ()

    def sign(self, tree: Path) -> bytes:
        """The signature over every file of `tree`, as the bytes of the library's signature file."""
        signing = _library().signing
        config = signing.Config().set_hashing_config(_hashing(tree))
        _check_key(self.private_key)
        try:
            if self.certificate is None:
                config.use_elliptic_key_signer(private_key=self.private_key)
            else:
                config.use_certificate_signer(
                    private_key=self.private_key, signing_certificate=self.certificate, certificate_chain=self.chain
                )
        except (ValueError, TypeError, OSError) as exc:
            raise SigningKeyError(
                f"cannot sign models with {self.private_key}: {exc}; {KEY_ENV} must name a PEM elliptic-curve "
                f"private key on P-256, P-384 or P-521 (openssl ecparam -name prime256v1 -genkey -noout -out key.pem)"
            ) from exc
        with tempfile.TemporaryDirectory(prefix="prebake-model-sig-") as scratch:
            out = Path(scratch, SIDE_NAME)
            config.sign(tree, out)
            return out.read_bytes()


def _check_key(path: Path) -> None:
    """SigningKeyError unless `path` holds an EC private key on a curve the library signs with."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, OSError) as exc:
        key, problem = None, str(exc)
    else:
        problem = f"it is a {type(key).__name__}"
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in _CURVES:
        raise SigningKeyError(
            f"cannot sign models with {path}: {problem}; {KEY_ENV} must name an unencrypted PEM elliptic-curve "
            f"private key on P-256, P-384 or P-521 (openssl ecparam -name prime256v1 -genkey -noout -out key.pem)"
        )


def model_signer_from_env(env: Mapping[str, str] = os.environ) -> ModelSigner | None:
    """The model signer PREBAKE_MODEL_SIGNING_KEY (with _CERT and _CHAIN) names, or None."""
    key = env.get(KEY_ENV, "").strip()
    cert = env.get(CERT_ENV, "").strip()
    chain = tuple(Path(p) for p in env.get(CHAIN_ENV, "").split(os.pathsep) if p.strip())
    if not key:
        if cert or chain:
            raise SigningKeyError(f"{CERT_ENV} or {CHAIN_ENV} is set without {KEY_ENV}: name the certificate's key")
        return None
    for path in (key, cert, *map(str, chain)):
        if path and not Path(path).is_file():
            raise SigningKeyError(f"model signing: {path} is not a file; check {KEY_ENV}, {CERT_ENV} and {CHAIN_ENV}")
    if chain and not cert:
        raise SigningKeyError(f"{CHAIN_ENV} is set without {CERT_ENV}: a chain goes with a signing certificate")
    _library()  # a missing extra fails here, before anything is baked
    return ModelSigner(Path(key), Path(cert) if cert else None, chain)


def verify_tree(tree: Path, signature: bytes, anchor: Anchor) -> None:
    """The library's verification of the files under `tree`; ModelSignatureError naming what differs."""
    verifying = _library().verifying
    config = verifying.Config()
    if anchor.public_key is not None:
        config.use_elliptic_key_verifier(public_key=anchor.public_key)
    else:
        config.use_certificate_verifier(certificate_chain=anchor.certificate_chain)
    with tempfile.TemporaryDirectory(prefix="prebake-model-sig-") as scratch:
        path = Path(scratch, SIDE_NAME)
        path.write_bytes(signature)
        try:
            config.verify(tree, path)
        except Exception as exc:  # the library raises ValueError and the crypto libraries' own errors
            raise ModelSignatureError(
                f"the model signature does not verify {tree} with {anchor.describe()}: {exc}"
            ) from exc


def check_signature(signature: bytes, anchors: Sequence[Anchor], manifest: Manifest) -> str:
    """The name of the anchor whose signature covers exactly `manifest`'s files; ModelSignatureError if none."""
    if len(signature) > MAX_SIDE_FILE_BYTES:
        raise ModelSignatureError(f"the model signature is over {MAX_SIDE_FILE_BYTES} bytes: it is not one")
    if not anchors:
        raise ModelSignatureError("no trusted model signing key to verify the model signature with")
    problems = []
    for anchor in anchors:
        try:
            signed = _verified_manifest(signature, anchor)
        except ModelSignatureError as exc:
            problems.append(str(exc))
            continue
        if (why := _differs(signed, manifest)) is not None:
            raise ModelSignatureError(
                f"the model signature by {anchor.name} verifies, but {why}: it signs other files than this "
                f"bundle's (blob {manifest.blob.digest[:23]}); sign this bundle's tree, or rebake it"
            )
        return anchor.name
    raise ModelSignatureError("; ".join(problems))


def _verified_manifest(signature: bytes, anchor: Anchor) -> ms_manifest.Manifest:
    """The library's manifest (files and digests) inside `signature`, once `anchor` verified it.

    The library's public API verifies a signature and a tree together; this check runs before the
    tree exists, so it calls the verifier the public API configures (model_signing._signing, the
    module `verifying.Config` uses) on the signature alone."""
    from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb

    verifier: Any
    try:
        if anchor.public_key is not None:
            verifier = sign_ec_key.Verifier(anchor.public_key)
        else:
            verifier = sign_certificate.Verifier(list(anchor.certificate_chain))
    except (ValueError, TypeError, OSError) as exc:
        raise ModelSignatureError(f"model signing key {anchor.describe()} cannot be read: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="prebake-model-sig-") as scratch:
        path = Path(scratch, SIDE_NAME)
        path.write_bytes(signature)
        try:
            parsed = sign_sigstore_pb.Signature.read(path)
        except Exception as exc:  # JSON, key and protobuf-shape errors alike
            raise ModelSignatureError(f"the model signature is not a model-signing signature file: {exc}") from exc
    try:
        return verifier.verify(parsed)  # type: ignore[no-any-return]
    except Exception as exc:  # ValueError, cryptography's InvalidSignature, certificate errors
        raise ModelSignatureError(f"the model signature does not verify with {anchor.describe()}: {exc}") from exc


def _differs(signed: ms_manifest.Manifest, manifest: Manifest) -> str | None:
    """Why the signed files and digests are not exactly the manifest's, or None."""
    serialization = signed.serialization_type
    if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256":
        return f"it hashes by {serialization.get('method')}/{serialization.get('hash_type')}, not files/sha256"
    got = {d.identifier: "sha256:" + d.digest.digest_hex for d in signed.resource_descriptors()}
    want = _file_digests(manifest)
    if missing := sorted(want.keys() - got.keys()):
        return f"it does not cover {len(missing)} file(s), first {missing[0]!r}"
    if extra := sorted(got.keys() - want.keys()):
        return f"it names {len(extra)} file(s) the bundle does not have, first {extra[0]!r}"
    if changed := sorted(p for p in want if want[p] != got[p]):
        return f"{len(changed)} file(s) differ, first {changed[0]!r}"
    return None


def _file_digests(manifest: Manifest) -> dict[str, str]:
    """Every path of `manifest` with the digest the library gives it: a link's is its target file's
    (the library follows links when it signs a tree that has them)."""
    by_path = {f.path: f for f in manifest.files}
    out = {}
    for f in manifest.files:
        entry, hops = f, 0
        while entry.link is not None and hops < 40:
            entry = by_path.get(posixpath.normpath(posixpath.join(posixpath.dirname(entry.path), entry.link)), entry)
            hops += 1
        out[f.path] = entry.sha256
    return out


def _hashing(tree: Path) -> Any:
    """The library's file-by-file sha256 hashing; links are followed when the tree has any."""
    hashing = _library().hashing
    has_links = any(p.is_symlink() for p in tree.rglob("*"))
    return hashing.Config().use_file_serialization(hashing_algorithm="sha256", allow_symlinks=has_links)


def _library() -> Any:
    from prebake.artifacts.extras import require

    require("model-signing", "an OpenSSF model signature")
    try:
        import model_signing
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError as exc:
        raise SigningKeyError(f"model signing needs the model-signing package ({exc}); {_INSTALL}") from exc
    return model_signing
