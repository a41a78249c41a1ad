"""Who is baking: the builder id and source revision a bake's provenance names, read at the edge.

    builder id    PREBAKE_BUILDER_ID, else the GitHub Actions workflow that runs the bake
                  (GITHUB_SERVER_URL/GITHUB_WORKFLOW_REF), else urn:prebake:builder:local:<host>
    source        PREBAKE_SOURCE_URI + PREBAKE_SOURCE_REVISION, else GitHub Actions' repository
                  and GITHUB_SHA, else the git checkout of the working folder (git rev-parse,
                  time-boxed), else none; a remote's credentials are never written
    dependencies  the host probe's software, with the driver in full

A policy (docs/trust.md) accepts builder ids by exact match or prefix, so an operator names
the CI workflow that may build for the fleet.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from prebake import __version__ as PREBAKE_VERSION
from prebake.artifacts.bake.provenance import Attest, BuildContext, SourceRevision, dependency_versions
from prebake.engine.common.probe import Host, declared_packages
from prebake.registry.trust.signing import KeySigner

BUILDER_ID_ENV = "PREBAKE_BUILDER_ID"
SOURCE_URI_ENV = "PREBAKE_SOURCE_URI"
SOURCE_REVISION_ENV = "PREBAKE_SOURCE_REVISION"
_GIT_TIMEOUT_S = 5.0
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^@/]*@", re.IGNORECASE)


def attester(signer: KeySigner | None, host: Host, env: Mapping[str, str] = os.environ) -> Attest | None:
    """How this process attests its bakes: with the signing key, or not at all when there is none."""
    if signer is None:
        return None
    from prebake.registry.trust.attestation import seal  # only where a key signs: a start without one needs none

    context = BuildContext(
        builder_id=builder_id(env),
        platform=host.platform.factors(),
        software=host.software.versions(),
        prebake_version=PREBAKE_VERSION,
        source=source_revision(env),
        invocation_id=env.get("GITHUB_RUN_ID", "") or uuid.uuid4().hex,
        packages=_package_urls(),
    )
    return Attest(context, lambda statement: seal(statement, signer.key, signer.name))


def host_versions(host: Host) -> dict[str, str]:
    """This node's versions by provenance dependency name: what a policy's "host" constraint compares."""
    return dependency_versions(host.software.versions(), PREBAKE_VERSION, _package_urls())


def _package_urls() -> dict[str, tuple[str, str]]:
    return {p.factor: (p.dependency or p.factor, p.purl) for p in declared_packages()}


def builder_id(env: Mapping[str, str] = os.environ) -> str:
    if explicit := env.get(BUILDER_ID_ENV, "").strip():
        return explicit
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_WORKFLOW_REF"):
        return f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env['GITHUB_WORKFLOW_REF']}"
    return f"urn:prebake:builder:local:{socket.gethostname()}"


def source_revision(env: Mapping[str, str] = os.environ, folder: Path | None = None) -> SourceRevision | None:
    uri, revision = env.get(SOURCE_URI_ENV, "").strip(), env.get(SOURCE_REVISION_ENV, "").strip()
    if uri and revision:
        return SourceRevision(_without_credentials(uri), revision)
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_REPOSITORY") and env.get("GITHUB_SHA"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        return SourceRevision(f"git+{server}/{env['GITHUB_REPOSITORY']}", env["GITHUB_SHA"])
    return _git_checkout(folder or Path.cwd())


def _git_checkout(folder: Path) -> SourceRevision | None:
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None or not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        return None
    remote = _git(folder, "config", "--get", "remote.origin.url")
    uri = f"git+{_without_credentials(remote)}" if remote else f"git+file://{_toplevel(folder)}"
    return SourceRevision(uri, commit)


def _toplevel(folder: Path) -> str:
    return _git(folder, "rev-parse", "--show-toplevel") or str(folder)


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def _without_credentials(uri: str) -> str:
    return _USERINFO.sub(r"\1", uri)
