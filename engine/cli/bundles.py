"""Registry commands: ls, verify, preheat."""

from __future__ import annotations

import argparse
import json
import sys

from prebake.artifacts.ports.listing import RegistryListing
from prebake.engine.adapters import kind_names
from prebake.engine.cli.common import command, json_option, registry_option


def add(sub) -> None:
    ls = command(
        sub,
        "ls",
        group="registry",
        help="list the bundles in a registry",
        examples=["prebake ls", "prebake ls --registry s3://team/prebake --kind graphs --json"],
        store="read",
    )
    registry_option(ls)
    ls.add_argument("--kind", choices=kind_names(), help="only this artifact kind (default: every kind)")
    json_option(ls)
    ls.set_defaults(run=cmd_ls)

    verify = command(
        sub,
        "verify",
        group="registry",
        help="re-hash every blob and check every index entry and signature of a registry",
        examples=["prebake verify --registry s3://team/prebake --deep", "prebake verify --quarantine --json"],
        store="read",
    )
    registry_option(verify)
    verify.add_argument("--quarantine", action="store_true", help="move bad entries aside")
    json_option(verify)
    verify.add_argument(
        "--deep", action="store_true", help="also open every blob and check it against its manifest's file list"
    )
    verify.add_argument("--store", action="store_true", help=argparse.SUPPRESS)  # old spelling of `store verify`
    verify.add_argument(
        "--policy", metavar="FILE", help="check every entry against this trust policy file (default: $PREBAKE_POLICY)"
    )
    verify.set_defaults(run=cmd_verify)

    preheat = command(
        sub,
        "preheat",
        group="registry",
        help="pull every bundle through a registry mirror once, so the nodes after cost the origin no blob bytes",
        examples=[
            "prebake preheat --mirror oci://mirror.local:5000/team/prebake",
            "prebake preheat --mirror oci://mirror.local:5000/team/prebake --kind graphs --key 3fa2c1 --json",
        ],
    )
    preheat.add_argument(
        "--mirror", required=True, metavar="oci://HOST/NAMESPACE/REPO", help="the mirror, as the nodes name it"
    )
    preheat.add_argument("--kind", choices=kind_names(), help="only this artifact kind (default: every kind)")
    preheat.add_argument(
        "--key", action="append", default=[], metavar="DIGEST", help="only this key digest, or its prefix (repeatable)"
    )
    preheat.add_argument(
        "--wait-s", type=float, default=120.0, help="how long the mirror may take to store a blob it streamed"
    )
    json_option(preheat)
    preheat.set_defaults(run=cmd_preheat)


def cmd_ls(args: argparse.Namespace) -> int:
    from prebake.engine.compose import open_address, open_store
    from prebake.registry.shared.transfer import listed

    registry = open_address(open_store(), args.registry)
    listing = RegistryListing(registry.url, tuple(listed(registry, args.kind)))
    print(json.dumps(listing.to_json(), indent=2, sort_keys=True) if args.json else listing.render())
    return 0


def cmd_preheat(args: argparse.Namespace) -> int:
    from prebake.artifacts.errors import ExitCode
    from prebake.artifacts.extras import require

    require("oci", "prebake preheat")  # an OCI-only command: its modules import httpx
    from prebake.engine.compose import open_address, open_store
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.preheat import PreheatReport, preheat

    mirror = open_address(open_store(), args.mirror)
    if not isinstance(mirror, OCIRegistry):
        print(
            f"prebake: --mirror {args.mirror!r} is not an OCI registry; name it as oci://HOST/NAMESPACE/REPO",
            file=sys.stderr,
        )
        return ExitCode.INVALID
    done = []
    for got in preheat(mirror, kind=args.kind, keys=tuple(args.key), wait_s=args.wait_s):
        done.append(got)
        if not args.json:
            print(got.render())  # as each is done: a preheat of many bundles takes a while
    report = PreheatReport(mirror.url, tuple(done))
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from prebake.engine.compose import open_address, open_store, registry_address, verify_trust
    from prebake.registry.review.verify import verify_registry

    if args.store:  # the old spelling of `prebake store verify`: the same check, the same output
        from prebake.engine.cli.store import cmd_store_verify

        print(
            "prebake: `prebake verify --store` is now `prebake store verify`; the old spelling still works for now",
            file=sys.stderr,
        )
        args.fix = False
        return cmd_store_verify(args)
    store = open_store()
    registry = open_address(store, args.registry)
    trust = verify_trust(args.policy, registry_address(store, args.registry), registry)
    report = verify_registry(registry, trust=trust, quarantine=args.quarantine, deep=args.deep)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(report.render())
    return report.exit_code
