"""Credentials for OCI registries, as users already have them, and the challenges that ask for them.

May read the environment, the Docker and podman config files, and run docker-credential-<helper>.
First found wins: PREBAKE_OCI_USERNAME + PREBAKE_OCI_PASSWORD; $REGISTRY_AUTH_FILE; then
$DOCKER_CONFIG/config.json or ~/.docker/config.json (credHelpers.<host>, auths.<host>.auth or its
identitytoken, credsStore). A `Basic` challenge sends the login on every request; `Bearer` trades
it at the realm for a token per scope (registry/oci/client.py keeps and renews it).
Written by hand: the Docker config and the credential-helper protocol are small, documented
formats that no maintained Python library reads.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prebake.artifacts.ports.errors import RegistryUnavailable

_HELPER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Login:
    """A login for one registry host, and where it came from (named in errors)."""

    username: str
    password: str  # or, when `identity_token`, an OAuth2 refresh token
    source: str
    identity_token: bool = False

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer", lower-cased
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge | None:
    """The first challenge of a WWW-Authenticate header (registries send one)."""
    m = re.match(r"\s*([A-Za-z]+)\s*(.*)", header or "")
    if m is None:
        return None
    params = {k.lower(): v for k, v in re.findall(r'([A-Za-z_]+)\s*=\s*"([^"]*)"', m.group(2))}
    params.update({k.lower(): v for k, v in re.findall(r'([A-Za-z_]+)\s*=\s*([^",\s]+)', m.group(2))})
    return Challenge(m.group(1).lower(), params)


def find_login(host: str, env: Mapping[str, str] = os.environ) -> Login | None:
    """The login for `host` (host[:port]) from the places above; None: go anonymous."""
    user, password = env.get("PREBAKE_OCI_USERNAME", ""), env.get("PREBAKE_OCI_PASSWORD", "")
    if user and password:
        return Login(user, password, "PREBAKE_OCI_USERNAME/PREBAKE_OCI_PASSWORD")
    for path in _config_files(env):
        config = _read_config(path)
        if config is None:
            continue
        login = _from_config(config, host, path, env)
        if login is not None:
            return login
    return None


def config_locations(env: Mapping[str, str] = os.environ) -> str:
    """Where find_login looked, for error messages."""
    return ", ".join(str(p) for p in _config_files(env)) or "no Docker config"


def _config_files(env: Mapping[str, str]) -> list[Path]:
    files = []
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(Path(env["REGISTRY_AUTH_FILE"]).expanduser())
    if env.get("DOCKER_CONFIG"):
        files.append(Path(env["DOCKER_CONFIG"]).expanduser() / "config.json")
    else:
        files.append(Path(env.get("HOME", str(Path.home()))) / ".docker" / "config.json")
    return files


def _read_config(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RegistryUnavailable(
            f"cannot read the Docker config {path}: {exc}; fix it or run `docker login` again"
        ) from exc
    return data if isinstance(data, dict) else None


def _from_config(config: dict[str, Any], host: str, path: Path, env: Mapping[str, str]) -> Login | None:
    helpers = config.get("credHelpers") or {}
    if isinstance(helpers, dict) and isinstance(helpers.get(host), str):
        return _from_helper(helpers[host], host, env)
    auths = config.get("auths") or {}
    if isinstance(auths, dict):
        for name, entry in auths.items():
            if _host_of(name) == host and isinstance(entry, dict):
                login = _from_auth_entry(entry, host, path)
                if login is not None:
                    return login
    store = config.get("credsStore")
    if isinstance(store, str) and store:
        return _from_helper(store, host, env)
    return None


def _from_auth_entry(entry: dict[str, Any], host: str, path: Path) -> Login | None:
    source = f"{path} (auths.{host})"
    if entry.get("identitytoken"):
        return Login("<token>", str(entry["identitytoken"]), source, identity_token=True)
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise RegistryUnavailable(
                f"the login for {host} in {path} is not base64 user:password; run `docker login {host}` again"
            ) from None
        return Login(user, password, source)
    if entry.get("username") and entry.get("password"):
        return Login(str(entry["username"]), str(entry["password"]), source)
    return None


def _from_helper(helper: str, host: str, env: Mapping[str, str]) -> Login | None:
    """Ask `docker-credential-<helper> get` for the login of `host` (the credential-helper protocol)."""
    program = shutil.which(f"docker-credential-{helper}", path=env.get("PATH"))
    if program is None:
        raise RegistryUnavailable(
            f"the Docker config names credential helper {helper!r} for {host}, but docker-credential-{helper} "
            f"is not on PATH; install it, or remove it from the config and log in with `docker login {host}`"
        )
    try:
        out = subprocess.run(
            [program, "get"], input=host, capture_output=True, text=True, timeout=_HELPER_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RegistryUnavailable(f"docker-credential-{helper} get failed for {host}: {exc}") from exc
    if out.returncode != 0:
        if "credentials not found" in (out.stdout + out.stderr).lower():
            return None
        raise RegistryUnavailable(
            f"docker-credential-{helper} get failed for {host}: {(out.stderr or out.stdout).strip()[:300]}; "
            f"log in again (`docker login {host}`)"
        )
    try:
        data = json.loads(out.stdout)
        user, secret = str(data["Username"]), str(data["Secret"])
    except (ValueError, KeyError, TypeError):
        raise RegistryUnavailable(f"docker-credential-{helper} answered something that is not a login") from None
    source = f"docker-credential-{helper}"
    return Login(user, secret, source, identity_token=user == "<token>")


def _host_of(name: str) -> str:
    """`https://host:port/v1/` and `host:port` both name host:port (as docker's config does)."""
    name = re.sub(r"^[a-z]+://", "", name.strip())
    return name.split("/", 1)[0]
