"""Attestations: a bundle's provenance Statement sealed in a DSSE envelope, published beside its blob.

    seal(statement, key, name)        DSSE envelope (securesystemslib.dsse) signed with the bake's
                                      ed25519 key; its keyid is the key's name, as in PREBAKE_TRUSTED_KEYS
    open_envelope(raw, keys)          the Statement, once one of `keys` verified the envelope
    check_attestation(raw, keys, m)   Provenance, or why it is refused: the envelope verifies, the
                                      Statement is SLSA provenance v1, its subject is m's blob

The envelope is securesystemslib's, the Statement the in-toto bindings' (prebake.artifacts.bake.provenance):
no format is written by hand here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from prebake.artifacts.bake.provenance import PAYLOAD_TYPE, Provenance, read_statement
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES
from prebake.registry.trust.signing import PublicKey, SigningKeyError

if TYPE_CHECKING:
    from securesystemslib.signer import SSlibKey

# securesystemslib is imported where it is used: its signer package imports boto3 (for its AWS
# signer) at import time, which every `prebake fetch` would pay before its first request
# (docs/performance.md, "Fleets fetching through a mirror", has the figure).


class AttestationError(BundleError):
    """An attestation is malformed, unsigned by a trusted key, or about another blob."""


def sslib_key(key: PublicKey) -> SSlibKey:
    """A trusted public key as securesystemslib's verifier takes it (keyid = the key's name)."""
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(Ed25519PublicKey.from_public_bytes(key.raw), keyid=key.name)


def seal(statement: bytes, private_key: Ed25519PrivateKey, name: str, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """The DSSE envelope of `statement`, signed by `name`'s ed25519 key, as JSON bytes."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner, SSlibKey

    if not isinstance(private_key, Ed25519PrivateKey):
        raise SigningKeyError(f"cannot attest as {name}: {type(private_key).__name__} is not an ed25519 key")
    signer = CryptoSigner(private_key, SSlibKey.from_crypto(private_key.public_key(), keyid=name))
    envelope = Envelope(statement, payload_type, {})
    envelope.sign(signer)
    return json.dumps(envelope.to_dict(), sort_keys=True).encode()


def open_envelope(raw: bytes, keys: Sequence[PublicKey], payload_type: str = PAYLOAD_TYPE) -> bytes:
    """The verified payload of a DSSE envelope; AttestationError saying why not."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import FormatError, VerificationError

    if len(raw) > MAX_SIDE_FILE_BYTES:
        raise AttestationError(f"the attestation is over {MAX_SIDE_FILE_BYTES} bytes: it is not one")
    try:
        envelope = Envelope.from_dict(json.loads(raw))
    except (ValueError, KeyError, TypeError, FormatError) as exc:
        raise AttestationError(f"the attestation is not a DSSE envelope: {exc}") from exc
    if envelope.payload_type != payload_type:
        raise AttestationError(f"the envelope's payload type is {envelope.payload_type!r}, not {payload_type}")
    if not keys:
        raise AttestationError("no trusted key to verify the attestation with")
    try:
        envelope.verify([sslib_key(k) for k in keys], 1)
    except VerificationError as exc:
        signers = ", ".join(sorted(envelope.signatures)) or "nobody"
        trusted = ", ".join(k.name for k in keys)
        raise AttestationError(
            f"the attestation's DSSE signature (by {signers}) does not verify against a trusted key ({trusted}): {exc}"
        ) from exc
    return envelope.payload


def check_attestation(raw: bytes, keys: Sequence[PublicKey], manifest: Manifest) -> Provenance:
    """The provenance of `manifest`'s bundle from its attestation, or AttestationError naming why not."""
    try:
        provenance = read_statement(open_envelope(raw, keys))
    except AttestationError:
        raise
    except BundleError as exc:
        raise AttestationError(str(exc)) from exc
    if provenance.subject_digest != manifest.blob.digest:
        raise AttestationError(
            f"the attestation is about blob {provenance.subject_digest[:23]}, not this bundle's "
            f"{manifest.blob.digest[:23]}: it belongs to another bundle; rebake or re-attest this one"
        )
    return provenance
