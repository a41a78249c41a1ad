"""`prebake doctor`: what this host can do beyond baking and serving, and why not (process snapshots),
and what would make its restores slower than they need be."""

from __future__ import annotations

import argparse
import json

from prebake.artifacts.errors import ExitCode
from prebake.engine.cli.common import command, json_option


def add(sub) -> None:
    doctor = command(
        sub,
        "doctor",
        group="serve",
        help="say whether this host can restore process snapshots (CRIU, privileges, kernel), and why not",
        examples=["prebake doctor", "PREBAKE_CRIU=~/.cache/prebake/criu/4.1.1/criu prebake doctor --json"],
    )
    json_option(doctor, "the answer")
    doctor.set_defaults(run=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 0 when this host can dump and restore snapshots, 1 when it cannot (the reason printed)."""
    from prebake.engine.bundled.snapshot.host import Able, can_snapshot, kdat_note, key_factors

    answer = can_snapshot()
    if args.json:
        print(json.dumps(answer.to_json(), sort_keys=True))
    elif isinstance(answer, Able):
        kernel = key_factors(answer)["kernel"]
        print(f"snapshots: yes: CRIU {answer.version} ({answer.criu}), kernel {kernel}; `criu check` passes")
        if note := kdat_note():  # what makes every restore here slower
            print(f"snapshots: note: {note}")
    else:
        print(f"snapshots: no: {answer.reason}; `prebake serve` starts from the bundles (docs/snapshots.md)")
    return ExitCode.OK if isinstance(answer, Able) else ExitCode.FAILED
