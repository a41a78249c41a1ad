"""Registry commands: ls, keygen, verify."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from prebake.artifacts.ports.listing import Listed
from prebake.artifacts.store.local import Store
from prebake.engine.cli.common import json_option, registry_option, size, table


def add(sub) -> None:
    ls = sub.add_parser("ls", help="list the bundles in a registry")
    registry_option(ls)
    ls.add_argument("--kind", help="only this artifact kind (buckets, autotune, graphs)")
    json_option(ls)
    ls.set_defaults(run=cmd_ls)

    keygen = sub.add_parser("keygen", help="make an ed25519 signing key pair for bundles")
    keygen.add_argument("name", help="the signer's name, e.g. ci-bakers-2026")
    keygen.add_argument("--dir", default=".", help="folder to write <name>.pem and <name>.pub into")
    keygen.set_defaults(run=cmd_keygen)

    verify = sub.add_parser("verify", help="re-hash every blob and check every index entry and signature")
    registry_option(verify)
    verify.add_argument("--quarantine", action="store_true", help="move bad entries aside")
    json_option(verify)
    verify.add_argument(
        "--deep", action="store_true", help="also open every blob and check it against its manifest's file list"
    )
    verify.add_argument(
        "--store", action="store_true", help="verify the local store instead (every tree and blob, always deep)"
    )
    verify.set_defaults(run=cmd_verify)


def cmd_ls(args: argparse.Namespace) -> int:
    from prebake.registry import open_registry
    from prebake.registry.base import listed

    store = Store()
    registry = open_registry(store.registry_address(args.registry))
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


def cmd_keygen(args: argparse.Namespace) -> int:
    from prebake.registry.signing import keygen_cli

    print(keygen_cli(args.name, Path(args.dir).resolve()))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from prebake.registry import open_registry
    from prebake.registry.signing import trust_from_env
    from prebake.registry.verify import verify_registry

    if args.store:  # the same check as `prebake store verify`
        from prebake.artifacts.store.admin import verify_store

        store_report = verify_store(Store())
        print(store_report.render())
        return store_report.exit_code
    registry = open_registry(Store().registry_address(args.registry))
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
