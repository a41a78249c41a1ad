"""A token service for docker-registry's `auth.token` mode (the distribution token spec), on loopback.

    with token_service({"ci": "pw"}) as tokens:          # tokens.realm: http://127.0.0.1:<port>/token
        with oci_server(tmp, token=tokens) as reg: ...   # the registry answers 401 Bearer realm=...
        tokens.expire_next = 1                           # the next token issued is already expired

GHCR, ECR, Harbor, Quay and Docker Hub all authenticate this way: the registry challenges with
`WWW-Authenticate: Bearer realm=..,service=..,scope=..`, the client asks the realm (with its login,
HTTP Basic) for a token for that scope, and sends it as `Authorization: Bearer`. The tokens are
real JWTs (ES256, the signing certificate in the x5c header) that the registry verifies against
the certificate this service hands it (`rootcertbundle`); nothing is mocked on the registry side.
Written by hand: a few lines of JWS over `cryptography`, as no token server is packaged in Debian.
"""

from __future__ import annotations

import base64
import datetime
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

SERVICE = "prebake-test-registry"
ISSUER = "prebake-test-token-issuer"


@dataclass
class TokenService:
    realm: str
    cert: Path  # the registry's rootcertbundle
    users: dict[str, str]
    expire_next: int = 0  # how many of the next tokens are issued already expired
    issued: list[str] = field(default_factory=list)  # the scope of every token issued
    refused: int = 0
    _key: object = None
    _der: bytes = b""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def token(self, scope: str, user: str) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        with self._lock:
            expired = self.expire_next > 0
            self.expire_next -= 1 if expired else 0
            self.issued.append(scope)
        now = int(time.time())
        access = []
        parts = scope.split(":")
        if len(parts) == 3 and parts[0] == "repository":
            access.append({"type": "repository", "name": parts[1], "actions": parts[2].split(",")})
        claims = {
            "iss": ISSUER,
            "sub": user,
            "aud": SERVICE,
            "exp": now - 600 if expired else now + 300,
            "nbf": now - 1200 if expired else now - 10,
            "iat": now - 1200 if expired else now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(self._der).decode()]}
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self._key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))  # type: ignore[attr-defined]
        return f"{signing}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@contextmanager
def token_service(users: dict[str, str], folder: Path) -> Iterator[TokenService]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prebake test token signer")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (folder / "token.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    service = TokenService(
        "", folder / "token.crt", dict(users), _key=key, _der=cert.public_bytes(serialization.Encoding.DER)
    )
    handler = type("Handler", (_Handler,), {"service": service})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    service.realm = f"http://127.0.0.1:{server.server_address[1]}/token"
    thread = threading.Thread(target=server.serve_forever, name="token-service", daemon=True)
    thread.start()
    try:
        yield service
    finally:
        server.shutdown()
        server.server_close()


class _Handler(BaseHTTPRequestHandler):
    service: TokenService

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        user = self._user()
        if user is None:
            self.service.refused += 1
            self._send(401, {"errors": [{"code": "UNAUTHORIZED", "message": "wrong login"}]})
            return
        scope = query.get("scope", [""])[0]
        token = self.service.token(scope, user)
        self._send(200, {"token": token, "access_token": token, "expires_in": 300})

    def _user(self) -> str | None:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return None
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return user if self.service.users.get(user) == password else None

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
