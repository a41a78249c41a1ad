"""Signing keys: keygen (an ed25519 key pair for bundles). Trust is set with PREBAKE_TRUSTED_KEYS (docs/trust.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from prebake.engine.cli.common import command


def add(sub) -> None:
    keygen = command(
        sub,
        "keygen",
        group="keys",
        help="make an ed25519 signing key pair for bundles",
        examples=["prebake keygen ci-bakers-2026 --dir ~/.config/prebake"],
    )
    keygen.add_argument("name", help="the signer's name, e.g. ci-bakers-2026")
    keygen.add_argument("--dir", default=".", help="folder to write <name>.pem and <name>.pub into (default: .)")
    keygen.set_defaults(run=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    from prebake.registry.trust.signing import keygen_cli

    print(keygen_cli(args.name, Path(args.dir).resolve()))
    return 0
