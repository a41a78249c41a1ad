"""`prebake doctor`: what this host can do beyond baking and serving, and why not (process snapshots)."""

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
    from prebake.engine.bundled.snapshot.host import Able, can_snapshot, key_factors

    answer = can_snapshot()
    if isinstance(answer, Able):
        factors = key_factors(answer)
        if args.json:
            print(json.dumps({"snapshots": True, "criu": str(answer.criu), "factors": factors}, sort_keys=True))
        else:
            print(
                f"snapshots: yes: CRIU {answer.version} ({answer.criu}), kernel {factors['kernel']}; `criu check` passes"
            )
        return ExitCode.OK
    if args.json:
        print(json.dumps({"snapshots": False, "error": answer.reason}))
    else:
        print(f"snapshots: no: {answer.reason}; `prebake serve` starts from the bundles (docs/snapshots.md)")
    return ExitCode.FAILED
