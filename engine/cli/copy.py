"""`prebake copy SRC DST`: every bundle (narrowed by --model, --kind, --platform...) with its signed
manifest, attestation and the registry's revocation list, verified under the policy in force,
create-only at DST; a rerun copies only what is left (registry/copy.py says how)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from prebake.artifacts.errors import ExitCode
from prebake.artifacts.ports.registry import Buffered
from prebake.engine.adapters import kind_names
from prebake.engine.cli.common import command, json_option


def add(sub) -> None:
    copy = command(
        sub,
        "copy",
        group="registry",
        help="copy bundles, their attestations and the revocation list from one registry into another, verified",
        examples=[
            "prebake copy s3://staging/prebake oci://registry.example.com/team/prebake --model tiny-llama",
            "prebake copy oci://registry.example.com/team/prebake oci-layout:/mnt/usb/prebake.tar",
            "prebake copy oci-layout:/mnt/usb/prebake.tar /srv/prebake-registry --json",
        ],
        store="write",
    )
    copy.add_argument("source", metavar="SRC", help="the registry to read (any address --registry takes)")
    copy.add_argument(
        "destination", metavar="DST", help="the registry to write (a folder is created; oci-layout:DIR or .tar too)"
    )
    copy.add_argument("--model", help="only bundles of this model (their model label)")
    copy.add_argument("--kind", choices=kind_names(), help="only this artifact kind (default: every kind)")
    copy.add_argument("--platform", help="only bundles of this platform label (cuda, cpu, hpu...)")
    copy.add_argument("--precision", help="only bundles of this precision label (bfloat16, float32...)")
    copy.add_argument("--key", default="", metavar="PREFIX", help="only keys starting with this hex prefix")
    copy.add_argument("--dry-run", action="store_true", help="verify and say what would be copied; write nothing")
    json_option(copy)
    copy.set_defaults(run=cmd_copy)


def cmd_copy(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from prebake.engine.compose import Context, open_address
    from prebake.registry.copy import Selection, copy_bundles, revocation_check_in_force

    context = Context.open(args.source)  # the trust policy in force, bound to the source's address
    source = context.registry
    destination = open_address(context.store, args.destination, creating=True)
    select = Selection(args.kind, args.model, args.platform, args.precision, args.key)
    with tqdm(desc="prebake copy", unit=" bundle", file=sys.stderr, disable=not sys.stderr.isatty()) as bar:

        def progress(done) -> None:
            bar.update(1)
            bar.set_postfix_str(f"{done.kind} {done.key_digest[:12]} {done.outcome.split(':')[0]}")

        report = copy_bundles(
            source,
            destination,
            trust=context.trust,
            select=select,
            check_revocations=revocation_check_in_force(context.trust),
            dry_run=args.dry_run,
            scratch=context.store.scratch(f"copy-{os.getpid()}"),  # a killed run's is swept
            progress=progress,
        )
    if isinstance(destination, Buffered) and not args.dry_run:
        destination.finish()  # an oci-layout tar is written out once, whole
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return ExitCode.OK if report.ok else ExitCode.FAILED
