"""`prebake promote`: review serving pods' write-backs in a registry's quarantine and sign them into its index.

Run on a trusted builder with PREBAKE_SIGNING_KEY set (registry/review/promote.py says what is checked).
--list shows what awaits review and how old it is; --dry-run re-verifies without publishing.
--prune removes what waited longer than the maximum age (registry/review/aging.py): --older-than, else
the policy file's [quarantine] max_age_days, else 7 days; it needs no signing key.
"""

from __future__ import annotations

import argparse
import json

from prebake.artifacts.errors import ExitCode, PrebakeError
from prebake.engine.cli.common import command, json_option, registry_option


def add(sub) -> None:
    promote = command(
        sub,
        "promote",
        group="registry",
        help="review write-backs waiting in the registry's quarantine: re-verify, sign, publish to the index",
        examples=[
            "prebake promote --registry s3://acme/prebake --list",
            "prebake promote --registry s3://acme/prebake",
            "prebake promote --registry s3://acme/prebake --prune --older-than 7d",
        ],
        store="write",
    )
    registry_option(promote)
    promote.add_argument("--kind", help="only write-backs of this artifact kind")
    promote.add_argument("--key", default="", metavar="PREFIX", help="only keys starting with this hex prefix")
    promote.add_argument("--list", action="store_true", help="show what awaits review; change nothing")
    promote.add_argument(
        "--dry-run", action="store_true", help="re-verify (or, with --prune, list) only; change nothing"
    )
    promote.add_argument(
        "--prune", action="store_true", help="remove write-backs that waited longer than the maximum age, unpromoted"
    )
    promote.add_argument(
        "--older-than",
        metavar="AGE",
        help="with --prune: the maximum age (7d, 36h; default: the policy's [quarantine] max_age_days, else 7d)",
    )
    json_option(promote)
    promote.set_defaults(run=cmd_promote)


def cmd_promote(args: argparse.Namespace) -> int:
    from prebake.engine.compose import Context
    from prebake.registry.review.promote import Review, promote
    from prebake.registry.trust.signing import SIGNING_KEY_ENV

    context = Context.open(args.registry, creating=True, trusting=False)
    address = context.address
    incoming_address, incoming = context.quarantine()
    if args.list:
        waiting = Review(incoming_address, address, waiting=tuple(incoming.list(args.kind)))
        print(json.dumps(waiting.to_json(), indent=2) if args.json else waiting.render_waiting())
        return ExitCode.OK
    if args.prune:
        return _prune(args, incoming, incoming_address)
    if args.older_than:
        raise PrebakeError("--older-than is the maximum age of --prune; add --prune, or drop it")
    if context.sign is None:
        raise PrebakeError(f"promotion signs what it reviewed: set {SIGNING_KEY_ENV} to the builder's key")
    results = promote(
        incoming,
        context.registry,
        signer=context.sign,
        attest=context.attest,
        kind=args.kind,
        key_prefix=args.key,
        dry_run=args.dry_run,
        model_sign=context.model_sign,
    )
    review = Review(incoming_address, address, results=tuple(results))
    print(json.dumps(review.to_json(), indent=2) if args.json else review.render())
    return ExitCode.OK if all(r.ok for r in results) else ExitCode.FAILED


def _prune(args: argparse.Namespace, incoming, incoming_address: str) -> int:
    from prebake.registry.review.aging import Pruned, max_age_in_force, prune

    oldest = max_age_in_force(args.older_than)
    pruned = Pruned(incoming_address, oldest, tuple(prune(incoming, oldest, dry_run=args.dry_run)), args.dry_run)
    print(json.dumps(pruned.to_json(), indent=2) if args.json else pruned.render())
    return ExitCode.OK
