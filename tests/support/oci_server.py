"""Debian's `docker-registry` (the distribution server, 2.8) as a real process on loopback.

    with oci_server(tmp) as reg:                       # plain HTTP, anonymous, deletes enabled
        reg.host                                       # "127.0.0.1:<port>"
    with oci_server(tmp, tls=True, users={"ci": "pw"}) as reg:   # htpasswd auth over TLS
        reg.ca                                         # the CA that signed its certificate (a test makes it)
    with oci_server(tmp, proxy_of=origin) as mirror:   # a pull-through mirror of `origin`
    with oci_server(tmp, token=tokens) as reg:         # bearer tokens from tests/support/oci_token.py

Each server gets its own storage folder, configuration and log under `root`; it listens on
127.0.0.1 only and is stopped by its process id. `oci_available()` says whether the binary is
installed (.ci/run installs it: `apt-get install docker-registry skopeo umoci`).
"""

from __future__ import annotations

import base64
import datetime
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.oci_token import ISSUER, SERVICE, TokenService
from tests.support.ports import free_port

BINARY = "docker-registry"
_ACCESS = re.compile(
    r'^\S+ - \S+ \[[^]]+\] "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[0-9.]+" \d{3} (?P<bytes>\d+|-)', re.M
)


def oci_available() -> bool:
    return shutil.which(BINARY) is not None


@dataclass
class OCIServer:
    host: str  # 127.0.0.1:<port>
    root: Path  # its storage, config and log
    scheme: str
    ca: Path | None = None
    users: dict[str, str] = field(default_factory=dict)
    pid: int = 0

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}"

    def address(self, repo: str = "team/prebake") -> str:
        return f"oci://{self.host}/{repo}"

    def env(self, *, docker_config: Path | None = None) -> dict[str, str]:
        """What a prebake client needs to reach this server: plain HTTP allowed, or its CA; and,
        with users, a Docker config.json holding the first user's login."""
        out: dict[str, str] = {}
        if self.scheme == "http":
            out["PREBAKE_OCI_PLAIN_HTTP"] = self.host
        if self.ca is not None:
            out["PREBAKE_OCI_CA_BUNDLE"] = str(self.ca)
        if self.users and docker_config is not None:
            user, password = next(iter(self.users.items()))
            write_docker_config(docker_config, self.host, user, password)
            out["DOCKER_CONFIG"] = str(docker_config)
        return out

    def blob_file(self, digest: str) -> Path:
        """Where the filesystem driver keeps a blob's bytes (a test corrupts them there)."""
        hexpart = digest.removeprefix("sha256:")
        return self.root / "storage/docker/registry/v2/blobs/sha256" / hexpart[:2] / hexpart / "data"

    def log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")

    def bytes_sent(self, path_contains: str = "/blobs/", method: str = "GET") -> int:
        """Body bytes this server sent for requests whose path holds `path_contains`, from its own
        access log (combined format: `"GET /v2/... HTTP/1.1" 206 1048576`)."""
        total = 0
        for m in _ACCESS.finditer(self.log()):
            if m["method"] == method and path_contains in m["path"] and m["bytes"] != "-":
                total += int(m["bytes"])
        return total


def umoci_unpack(image: str, dest: Path) -> Path:
    """`umoci unpack --rootless` of an OCI layout's image (`LAYOUT:TAG`) into `dest`, as an
    independent reader of what prebake pushed; the unpacked tree (`dest/rootfs`)."""
    done = subprocess.run(
        ["umoci", "unpack", "--rootless", "--image", image, str(dest)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return dest / "rootfs"


def write_docker_config(folder: Path, host: str, user: str, password: str) -> Path:
    """A Docker config.json as `docker login HOST` leaves it (auths.<host>.auth = base64 user:password)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    path = folder / "config.json"
    path.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return path


@contextmanager
def oci_server(
    root: Path,
    *,
    tls: bool = False,
    users: dict[str, str] | None = None,
    proxy_of: OCIServer | str | None = None,
    token: TokenService | None = None,
    delete: bool = True,
    start_timeout_s: float = 30.0,
) -> Iterator[OCIServer]:
    """Start docker-registry on a free loopback port, wait until /v2/ answers, yield it; stop it by pid."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # the free port can be taken between choosing it and the server binding it
        port = free_port()
        server = OCIServer(f"127.0.0.1:{port}", root, "https" if tls else "http", users=dict(users or {}))
        if token is not None:
            server.users = dict(token.users)
        config = _config(server, tls=tls, proxy_of=proxy_of, token=token, delete=delete)
        with (root / "server.log").open("ab") as log:
            proc = subprocess.Popen(
                [BINARY, "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root)},
            )
        server.pid = proc.pid
        if _wait_until_up(proc, server, start_timeout_s):
            break
        _stop(proc)
    else:
        raise RuntimeError(f"docker-registry did not start; its log says:\n{server.log()[-2000:]}")
    try:
        yield server
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, 9)
            proc.wait()


def _config(
    server: OCIServer, *, tls: bool, proxy_of: OCIServer | str | None, token: TokenService | None, delete: bool
) -> Path:
    import json

    cfg: dict = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(server.root / "storage")},
            "delete": {"enabled": delete},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {"addr": server.host, "secret": "prebake-test-secret", "relativeurls": False},
    }
    if tls:
        cert, key, ca = _make_certificates(server.root / "tls")
        cfg["http"]["tls"] = {"certificate": str(cert), "key": str(key)}
        server.ca = ca
    if token is not None:
        cfg["auth"] = {
            "token": {"realm": token.realm, "service": SERVICE, "issuer": ISSUER, "rootcertbundle": str(token.cert)}
        }
    elif server.users:
        path = server.root / "htpasswd"
        path.write_text("".join(f"{u}:{_bcrypt(p)}\n" for u, p in server.users.items()))
        cfg["auth"] = {"htpasswd": {"realm": "prebake-test", "path": str(path)}}
    if proxy_of is not None:
        cfg["proxy"] = {"remoteurl": proxy_of if isinstance(proxy_of, str) else proxy_of.url}
    path = server.root / "config.yml"
    path.write_text(json.dumps(cfg))  # YAML is a superset of JSON
    return path


def _bcrypt(password: str) -> str:
    """An htpasswd line's hash: bcrypt, which is all distribution accepts (htpasswd -B)."""
    htpasswd = shutil.which("htpasswd")
    if htpasswd is not None:
        out = subprocess.run([htpasswd, "-nbB", "u", password], check=True, capture_output=True, text=True)
        return out.stdout.strip().split(":", 1)[1]
    import bcrypt  # type: ignore[import-not-found]

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()


def _make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 it signed: (certificate, key, CA certificate)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prebake test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.crt").write_bytes(ca_cert.public_bytes(pem))
    (folder / "server.crt").write_bytes(cert.public_bytes(pem))
    (folder / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "server.crt", folder / "server.key", folder / "ca.crt"


def _wait_until_up(proc: subprocess.Popen, server: OCIServer, timeout_s: float) -> bool:
    context = ssl.create_default_context(cafile=str(server.ca)) if server.ca else None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(f"{server.url}/v2/", timeout=1, context=context)
            return True
        except urllib.error.HTTPError as exc:  # 401 from an htpasswd server is "up"
            if exc.code == 401:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False
