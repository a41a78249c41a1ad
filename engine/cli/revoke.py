"""`prebake revoke`: add key ids and bundle digests to a registry's signed revocation list.

The list is registry/trust/revocation.py's (`revoke`): read (its entries kept), extended, given the next
serial and a fresh `issued` time, signed with PREBAKE_SIGNING_KEY (or --signing-key; the key must be
one the fleet's policy names under [revocation]) and written to <registry>/meta/. Run it with
nothing to add to re-issue the list before it goes stale (max_age_hours), e.g. from a cron job.
"""

from __future__ import annotations

import argparse
import json
import re

from prebake.artifacts.errors import ExitCode, PrebakeError
from prebake.engine.cli.common import command, json_option, registry_option

_DIGEST = re.compile(r"^(sha256:)?([0-9a-f]{64})$")


def add(sub) -> None:
    revoke = command(
        sub,
        "revoke",
        group="keys",
        help="revoke signing keys or bundles: sign and publish the registry's revocation list",
        examples=[
            "prebake revoke --key ci-2025 --reason 'leaked 2026-11-30' --registry s3://acme/prebake",
            "prebake revoke --registry s3://acme/prebake   # re-issue the list before it goes stale",
        ],
    )
    registry_option(revoke)
    revoke.add_argument("--key", action="append", default=[], metavar="NAME", help="a key id (name) to revoke")
    revoke.add_argument(
        "--bundle", action="append", default=[], metavar="DIGEST", help="a bundle's blob digest (sha256:...) to revoke"
    )
    revoke.add_argument("--reason", default="", help="why, recorded beside each entry added now")
    revoke.add_argument("--signing-key", metavar="PEM", help="the revocation key (default: $PREBAKE_SIGNING_KEY)")
    json_option(revoke)
    revoke.set_defaults(run=cmd_revoke)


def cmd_revoke(args: argparse.Namespace) -> int:
    from prebake.engine.compose import Context
    from prebake.registry.trust.revocation import Revoked, revoke
    from prebake.registry.trust.signing import SIGNING_KEY_ENV

    context = Context.open(args.registry, creating=True, trusting=False, signing_key=args.signing_key)
    if context.sign is None:
        raise PrebakeError(
            f"say which key signs the revocation list: --signing-key PEM or {SIGNING_KEY_ENV} (a key the "
            f"policy's [revocation] table names)"
        )
    bundles = [_digest(d) for d in args.bundle]
    entries = revoke(
        context.registry, context.address, context.sign, keys=args.key, bundles=bundles, reason=args.reason
    )
    revoked = Revoked(context.address, context.sign.name, entries)
    print(json.dumps(revoked.to_json(), indent=2) if args.json else revoked.render())
    return ExitCode.OK


def _digest(text: str) -> str:
    match = _DIGEST.match(text.strip().lower())
    if match is None:
        raise PrebakeError(
            f"--bundle {text!r} is not a blob digest; give sha256:<64 hex> (`prebake ls --json` shows them)"
        )
    return "sha256:" + match[2]
