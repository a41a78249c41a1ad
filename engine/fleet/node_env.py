"""What a Ray node's bake sees of the driver's settings: the registry settings that are not
secrets always, the credentials only when asked (`prebake bake --executor ray --forward-credentials`).

    forwarded(env, credentials=False)   the variables for Ray's runtime_env {"env_vars": ...}
    registry_used(env, address)         one line naming the registry and the settings a node used

A Ray task sees the node's environment, not the driver's: without forwarding, a bake driven with
AWS_ENDPOINT_URL pointing at a MinIO server fails on every node with a bare RegistryUnavailable.
S3 addressing style has no environment variable in botocore (it lives in each node's AWS config
file), so it is not forwarded; PREBAKE_HOME and PREBAKE_RECIPES are the node's own.
"""

from __future__ import annotations

from collections.abc import Mapping

SETTINGS = (  # not secrets: where the registry is and how to talk to it
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CA_BUNDLE",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
    "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
    "HF_HUB_DISABLE_XET",
    "HF_HUB_ETAG_TIMEOUT",
    "HF_HUB_DOWNLOAD_TIMEOUT",
)
CREDENTIALS = (  # forwarded only when asked
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "HF_TOKEN",
    "PREBAKE_SIGNING_KEY",
    "PREBAKE_API_KEY",
)
NODE_OWN = ("PREBAKE_HOME", "PREBAKE_RECIPES", "PREBAKE_BUCKETS_FILE", "PREBAKE_AUTOTUNE_FILE", "PREBAKE_GRAPHS_DIR")
SHOWN = (
    "PREBAKE_REGISTRY",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "HF_ENDPOINT",
)


def forwarded(env: Mapping[str, str], *, credentials: bool = False) -> dict[str, str]:
    """The driver's variables a node's bake gets: SETTINGS and PREBAKE_* (not the node's own, not
    test hooks), plus CREDENTIALS when `credentials`."""
    names = set(SETTINGS)
    names |= {n for n in env if n.startswith("PREBAKE_") and not n.startswith("PREBAKE_TEST_")}
    names -= set(NODE_OWN) | set(CREDENTIALS)
    if credentials:
        names |= set(CREDENTIALS)
    return {n: env[n] for n in sorted(names) if n in env}


def registry_used(env: Mapping[str, str], address: str | None) -> str:
    """The registry a node used and the settings that decide where it went, credentials by presence only."""
    where = address or env.get("PREBAKE_REGISTRY") or "this node's embedded registry ($PREBAKE_HOME/registry)"
    shown = [f"{n}={env[n]}" for n in SHOWN if env.get(n)]
    unset = [n for n in ("AWS_ENDPOINT_URL", "HF_ENDPOINT") if not env.get(n)]
    creds = [n for n in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "HF_TOKEN") if env.get(n)]
    parts = shown + ([f"unset: {', '.join(unset)}"] if unset else [])
    parts.append(f"credentials: {', '.join(creds) + ' set' if creds else 'none set'}")
    return f"registry {where}, as this node saw it ({'; '.join(parts)})"
