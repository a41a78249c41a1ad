"""`prebake promote`: review serving pods' write-backs in a registry's quarantine and sign them into its index.

Run on a trusted builder with PREBAKE_SIGNING_KEY set (registry/promote.py says what is checked).
--list shows what awaits review and how old it is; --dry-run re-verifies without publishing.
"""

from __future__ import annotations

import argparse
import json

from prebake.artifacts.errors import ExitCode, PrebakeError
from prebake.artifacts.store.local import Store
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
        ],
        store="write",
    )
    registry_option(promote)
    promote.add_argument("--kind", help="only write-backs of this artifact kind")
    promote.add_argument("--key", default="", metavar="PREFIX", help="only keys starting with this hex prefix")
    promote.add_argument("--list", action="store_true", help="show what awaits review; change nothing")
    promote.add_argument("--dry-run", action="store_true", help="re-verify everything; publish nothing")
    json_option(promote)
    promote.set_defaults(run=cmd_promote)


def cmd_promote(args: argparse.Namespace) -> int:
    from prebake.engine.common.builder import attester
    from prebake.engine.common.probe import current_host
    from prebake.registry import open_registry
    from prebake.registry.promote import promote
    from prebake.registry.signing import SIGNING_KEY_ENV, signer_from_env
    from prebake.registry.writeback import quarantine_address

    address = Store().registry_address(args.registry)
    incoming_address = quarantine_address(address)
    incoming = open_registry(incoming_address)
    if args.list:
        rows = [
            {"kind": m.kind, "key": m.key_digest, "model": m.labels.get("model", ""), "created": m.created,
             "builder": m.builder}
            for m in incoming.list(args.kind)
        ]  # fmt: skip
        if args.json:
            print(json.dumps({"quarantine": incoming_address, "waiting": rows}, indent=2))
        else:
            print(f"{len(rows)} write-back(s) awaiting review in {incoming_address}")
            for row in rows:
                print(f"  {row['kind']:9} {row['key'][:16]}  {row['model']:20} {row['created']}  {row['builder']}")
        return ExitCode.OK
    signer = signer_from_env()
    if signer is None:
        raise PrebakeError(f"promotion signs what it reviewed: set {SIGNING_KEY_ENV} to the builder's key")
    results = promote(
        incoming,
        open_registry(address),
        signer=signer,
        attest=attester(signer, current_host()),
        kind=args.kind,
        key_prefix=args.key,
        dry_run=args.dry_run,
    )
    if args.json:
        print(json.dumps({"quarantine": incoming_address, "index": address,
                          "results": [r.__dict__ for r in results]}, indent=2))  # fmt: skip
    else:
        print(f"promote {incoming_address} -> {address}: {len(results)} write-back(s)")
        for r in results:
            print(f"  {r.kind:9} {r.key_digest[:16]}  {r.outcome}")
    return ExitCode.OK if all(r.ok for r in results) else ExitCode.FAILED
