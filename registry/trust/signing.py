"""Signing: ed25519 signatures over a manifest's signed payload, and the trust that checks them.

Installing a bundle runs its code (pickles, shared objects), so a reader must know who baked it.
A baker signs `Manifest.signed_payload(2)` (everything but the signatures); version 1 signatures
are refused unless PREBAKE_ACCEPT_V1_SIGNATURES=1 (docs/trust.md, "Signatures, version 2").
Trusted keys are named lines, like Nix's trusted-public-keys:

    <directory>/<name>.pem   private key, PKCS#8 PEM, mode 0600: PREBAKE_SIGNING_KEY points here
    <directory>/<name>.pub   `ci-builder-1:<base64 of the raw 32-byte key>`: for PREBAKE_TRUSTED_KEYS

The environment is read only by `signer_from_env` and `trust_from_env`, at the edges.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import SIGNATURE_VERSION, Manifest, Signature
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.ports.registry import TrustCheck

SIGNING_KEY_ENV = "PREBAKE_SIGNING_KEY"
SIGNING_KEY_NAME_ENV = "PREBAKE_SIGNING_KEY_NAME"
TRUSTED_KEYS_ENV = "PREBAKE_TRUSTED_KEYS"
ACCEPT_V1_ENV = "PREBAKE_ACCEPT_V1_SIGNATURES"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SEPARATORS = re.compile(r"[\s,]+")
_log = logging.getLogger("prebake.trust")
_warned_unverified = False  # the "bundles are unverified" warning is said once per process


class SigningKeyError(PrebakeError, ValueError):
    """A signing or public key is missing, unreadable or malformed."""


@dataclass(frozen=True)
class PublicKey:
    """A named ed25519 public key, written as one line "<name>:<base64 raw key>"."""

    name: str
    raw: bytes = field(repr=False)

    @classmethod
    def parse(cls, line: str, source: str = "public key") -> PublicKey:
        """Read "<name>:<base64 of 32 bytes>", naming `source` and the expected form on any problem."""
        name, sep, encoded = line.strip().partition(":")
        raw = _b64decode(encoded)
        if not sep or not _NAME.match(name) or raw is None or not _loads_as_public_key(raw):
            raise SigningKeyError(
                f"{source} {_shorten(line)!r} is not a public key line: expected '<name>:<base64 of 32 bytes>' "
                f"as printed by `prebake keygen` (the contents of its .pub file)"
            )
        return cls(name, raw)

    @property
    def line(self) -> str:
        return f"{self.name}:{base64.b64encode(self.raw).decode()}"

    def verifies(self, signature: bytes, payload: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, payload)
        except InvalidSignature:
            return False
        return True


# -- keys ----------------------------------------------------------------------------------


def generate_keypair(name: str) -> tuple[bytes, str]:
    """A fresh ed25519 key: (private key as PKCS#8 PEM, public line "<name>:<base64>")."""
    _check_name(name)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem, PublicKey(name, _raw_public(private)).line


def write_keypair(name: str, directory: Path | str) -> tuple[Path, Path]:
    """Write <directory>/<name>.pem (mode 0600) and <name>.pub atomically; never overwrite either."""
    directory = Path(directory).expanduser()
    private_path, public_path = directory / f"{name}.pem", directory / f"{name}.pub"
    pem, line = generate_keypair(name)
    for path in (private_path, public_path):
        if path.exists():
            raise SigningKeyError(
                f"{path} already exists; refusing to overwrite a key. Pick another name, or remove the "
                f"old pair yourself (every reader that trusts it must then be given the new public line)"
            )
    # create_only writes a mkstemp file (mode 0600) and hard-links it into place: atomic, create-only.
    if not fsutil.create_only(private_path, pem):
        raise SigningKeyError(f"{private_path} appeared while the key was being written; run keygen again")
    if not fsutil.create_only(public_path, (line + "\n").encode()):
        private_path.unlink(missing_ok=True)
        raise SigningKeyError(f"{public_path} appeared while the key was being written; run keygen again")
    public_path.chmod(0o644)
    return private_path, public_path


def load_private_key(path: Path | str) -> Ed25519PrivateKey:
    """Read an ed25519 private key PEM, or say which file is wrong and how to make a good one."""
    path = Path(path).expanduser()
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(
            f"signing key {path} cannot be read ({exc.strerror or exc}); create one with "
            f"`prebake keygen <name>` and set {SIGNING_KEY_ENV} to its .pem file"
        ) from exc
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(
            f"signing key {path} is not an unencrypted PEM private key ({exc}); create one with `prebake keygen <name>`"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(
            f"signing key {path} is a {type(key).__name__}, prebake signs with ed25519 only; "
            f"create one with `prebake keygen <name>`"
        )
    return key


# -- signing and checking --------------------------------------------------------------------


def sign(manifest: Manifest, private_key: Ed25519PrivateKey, signer_name: str) -> Manifest:
    """A copy of `manifest` signed by `signer_name`; an older signature by the same name is replaced."""
    _check_name(signer_name)
    if not isinstance(private_key, Ed25519PrivateKey):
        raise SigningKeyError(f"cannot sign as {signer_name}: {type(private_key).__name__} is not an ed25519 key")
    value = base64.b64encode(private_key.sign(manifest.signed_payload(SIGNATURE_VERSION))).decode()
    kept = tuple(s for s in manifest.signatures if s.signer != signer_name)
    signature = Signature(signer=signer_name, signature=value, version=SIGNATURE_VERSION)
    return manifest.model_copy(update={"signatures": kept + (signature,)})


@dataclass(frozen=True)
class TrustPolicy:
    """The public keys a reader trusts, by name. `check` is a TrustCheck: None, or why not."""

    keys: tuple[PublicKey, ...]
    accept_v1: bool = False  # trust signatures made before labels were covered (PREBAKE_ACCEPT_V1_SIGNATURES=1)

    def __post_init__(self) -> None:
        if not self.keys:
            raise SigningKeyError(
                "a trust policy needs at least one public key; give the lines `prebake keygen` prints"
            )
        by_name: dict[str, PublicKey] = {}
        for key in self.keys:
            if by_name.setdefault(key.name, key) != key:
                raise SigningKeyError(
                    f"two different trusted keys are both named {key.name!r}; give each key its own name"
                )

    @classmethod
    def from_lines(cls, lines: Iterable[str], source: str = "public key", *, accept_v1: bool = False) -> TrustPolicy:
        keys = {PublicKey.parse(line, source) for line in lines if line.strip()}
        return cls(tuple(sorted(keys, key=lambda k: k.name)), accept_v1)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys)

    def check(self, manifest: Manifest) -> str | None:
        """None when a trusted key's signature verifies; otherwise why the manifest is refused."""
        trusted = ", ".join(self.names)
        if not manifest.signatures:
            return f"unsigned; trust requires a signature by one of: {trusted} (bake with {SIGNING_KEY_ENV} set)"
        keys = {k.name: k for k in self.keys}
        broken: list[str] = []
        old: list[str] = []
        for sig in manifest.signatures:
            key = keys.get(sig.signer)
            if key is None:
                continue
            if sig.version not in (1, SIGNATURE_VERSION) or (sig.version == 1 and not self.accept_v1):
                old.append(f"{sig.signer} (version {sig.version})")
                continue
            raw = _b64decode(sig.signature)
            if raw is not None and len(raw) == 64 and key.verifies(raw, manifest.signed_payload(sig.version)):
                return None
            broken.append(sig.signer)
        if old and not broken:
            return (
                f"signed by {old[0]} in a signature version this reader does not accept: version 1 did not "
                f"cover the labels, created and builder fields, and versions above {SIGNATURE_VERSION} need a "
                f"newer prebake; rebake and re-sign it, or set {ACCEPT_V1_ENV}=1 to trust version 1 signatures"
            )
        if broken:
            return (
                f"signature by {broken[0]} does not verify: the manifest was changed after signing "
                f"(or its signature is corrupt); do not install it, rebake and re-sign"
            )
        signers = ", ".join(sorted({s.signer for s in manifest.signatures}))
        return f"signed by unknown signer {signers} (trusted: {trusted}); add its public line to {TRUSTED_KEYS_ENV} if you trust it"

    __call__ = check


# -- the environment, read at the edges -----------------------------------------------------


@dataclass(frozen=True)
class KeySigner:
    """A Signer (Manifest -> signed Manifest) holding one named private key."""

    name: str
    key: Ed25519PrivateKey = field(repr=False)

    def __call__(self, manifest: Manifest) -> Manifest:
        return sign(manifest, self.key, self.name)


def signer_from_env(env: Mapping[str, str] = os.environ) -> KeySigner | None:
    """The signer named by PREBAKE_SIGNING_KEY (and PREBAKE_SIGNING_KEY_NAME), or None when unset."""
    path = env.get(SIGNING_KEY_ENV, "").strip()
    if not path:
        return None
    name = env.get(SIGNING_KEY_NAME_ENV, "").strip() or Path(path).stem
    if not _NAME.match(name):
        raise SigningKeyError(
            f"signer name {name!r} (from {SIGNING_KEY_NAME_ENV} or the key file's name) must be letters, "
            f"digits, '.', '_' or '-'; set {SIGNING_KEY_NAME_ENV} to the name the key was made with"
        )
    return KeySigner(name, load_private_key(path))


def trust_from_env(env: Mapping[str, str] = os.environ) -> TrustCheck | None:
    """The trust policy from PREBAKE_TRUSTED_KEYS (key lines, or a file of them), or None when unset.

    None means bundles are installed unverified; that is said once per process, on stderr.
    """
    value = env.get(TRUSTED_KEYS_ENV, "").strip()
    if not value:
        _warn_unverified()
        return None
    accept_v1 = env.get(ACCEPT_V1_ENV, "").strip().lower() in ("1", "on", "true", "yes")
    tokens = _SEPARATORS.split(value)
    if len(tokens) == 1 and (":" not in value or Path(value).expanduser().is_file()):
        policy = _policy_from_file(Path(value).expanduser())
        return (TrustPolicy(policy.keys, accept_v1) if accept_v1 else policy).check
    return TrustPolicy.from_lines(tokens, source=TRUSTED_KEYS_ENV, accept_v1=accept_v1).check


def keygen_cli(name: str, directory: Path | str) -> str:
    """Make a key pair under `directory`; return what `prebake keygen` prints."""
    private_path, public_path = write_keypair(name, directory)
    line = public_path.read_text().strip()
    return "\n".join(
        [
            f"private key: {private_path}  (mode 0600; keep it secret, it signs bundles as {name!r})",
            f"public key:  {public_path}",
            f"             {line}",
            "",
            "to sign what this machine bakes:",
            f"  export {SIGNING_KEY_ENV}={private_path}",
            "to verify bundles where they are fetched and served (several keys: separate with commas):",
            f"  export {TRUSTED_KEYS_ENV}={line}",
        ]
    )


# -- private steps ---------------------------------------------------------------------------


def _policy_from_file(path: Path) -> TrustPolicy:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SigningKeyError(
            f"{TRUSTED_KEYS_ENV}={path} is neither a public key line '<name>:<base64>' nor a readable file "
            f"({exc.strerror or exc}); give the key lines themselves or a file with one per line"
        ) from exc
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise SigningKeyError(f"trusted keys file {path} holds no keys; put the lines `prebake keygen` prints in it")
    return TrustPolicy.from_lines(lines, source=f"line in {path}")


def _warn_unverified() -> None:
    global _warned_unverified
    if _warned_unverified:
        return
    _warned_unverified = True
    _log.warning(
        "WARNING: %s is not set, so bundles are installed UNVERIFIED, and installing a bundle runs "
        "its code. To verify them, set %s to the public key lines printed by `prebake keygen` "
        "(comma separated) or to a file holding one per line.",
        TRUSTED_KEYS_ENV,
        TRUSTED_KEYS_ENV,
    )


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise SigningKeyError(
            f"key name {name!r} must start with a letter or digit and hold only letters, digits, '.', '_' "
            f"or '-' (it goes before the ':' of the public key line)"
        )


def _raw_public(private: Ed25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _loads_as_public_key(raw: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return False
    return True


def _b64decode(text: str) -> bytes | None:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def _shorten(text: str, limit: int = 60) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."
