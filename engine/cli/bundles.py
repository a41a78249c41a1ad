"""Registry commands: ls, verify."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from prebake.artifacts.ports.listing import Listed
from prebake.artifacts.store.local import Store
from prebake.engine.adapters import KIND_NAMES
from prebake.engine.cli.common import command, json_option, registry_option, size, table


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
    ls.add_argument("--kind", choices=KIND_NAMES, help="only this artifact kind (default: every kind)")
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
    verify.set_defaults(run=cmd_verify)


def cmd_ls(args: argparse.Namespace) -> int:
    from prebake.engine.compose import open_address
    from prebake.registry.base import listed

    registry = open_address(Store(), args.registry)
    bundles = list(listed(registry, args.kind))
    if args.json:
        print(
            json.dumps({"registry": registry.url, "bundles": [_ls_json(b) for b in bundles]}, indent=2, sort_keys=True)
        )
        return 0
    rows = [_ls_row(b) for b in bundles]
    headers = ("MODEL", "KIND", "PLATFORM", "PRECISION", "TP", "SIZE", "CREATED", "KEY")
    print(table(headers, rows) if rows else f"no bundles in {registry.url}")
    return 0


def _ls_row(m: Listed) -> tuple[str, ...]:
    labels = m.labels
    return (
        labels.get("model", "?"),
        m.kind,
        labels.get("platform", "?"),
        labels.get("precision", "-"),
        labels.get("tp", "-"),
        size(m.blob.size),
        m.created,
        m.key_digest[:16],
    )


def _ls_json(m: Listed) -> dict:
    return {
        "kind": m.kind,
        "key": m.key_digest,
        "model": m.labels.get("model"),
        "labels": dict(m.labels),
        "blob": m.blob.digest,
        "bytes": m.blob.size,
        "created": m.created,
        "builder": m.builder,
        "build_seconds": m.build_seconds,
        "signers": list(m.signers),
    }


def cmd_verify(args: argparse.Namespace) -> int:
    from prebake.engine.compose import open_address
    from prebake.registry.signing import trust_from_env
    from prebake.registry.verify import verify_registry

    if args.store:  # the old spelling of `prebake store verify`: the same check, the same output
        from prebake.engine.cli.store import cmd_store_verify

        print(
            "prebake: `prebake verify --store` is now `prebake store verify`; the old spelling still works for now",
            file=sys.stderr,
        )
        args.fix = False
        return cmd_store_verify(args)
    registry = open_address(Store(), args.registry)
    report = verify_registry(registry, trust=trust_from_env(), quarantine=args.quarantine, deep=args.deep)
    if args.json:
        payload = {
            "registry": report.registry,
            "entries": report.entries,
            "ok": report.ok,
            "bad": report.bad,
            "findings": [dataclasses.asdict(f) for f in report.findings],
            "notes": list(report.notes),
        }
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(report.render())
    return report.exit_code
