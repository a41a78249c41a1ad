"""The trust policy in force: read from the environment at the edges and handed down.

    PREBAKE_TRUSTED_KEYS=LINES   any of these keys may sign anything

A TrustCheck (artifacts.fetch) answers one question about a manifest: None, or why the
policy refuses it. Every path that uses a bundle, the store's included, asks it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from artifacts.fetch import TrustCheck

from .signing import TRUSTED_KEYS_ENV, trust_from_env


def trust_in_force(env: Mapping[str, str] = os.environ, *, warn: bool = True) -> TrustCheck | None:
    """The keys of PREBAKE_TRUSTED_KEYS, else None (bundles unverified; said once per process when `warn`)."""
    if not warn and not env.get(TRUSTED_KEYS_ENV, "").strip():
        return None
    return trust_from_env(env)
