"""Fleet planning commands: plan, profile, ray-resources.

    prebake plan --model M [--precision P] [--tp N] [--registry R] [--profiles FILE]
                 [--missing-only] [--format table|json|github-matrix]
    prebake profile [--name N] [--label L ...]       this host's builder profile (TOML)
    prebake ray-resources                            the --resources JSON for `ray start`

The JSON format (schema "prebake.plan/1") is stable; docs/fleet.md describes every field.
"""

from __future__ import annotations

import argparse
import json

from prebake.artifacts.bake.fleet_plan import FleetPlan, github_matrix, ray_resource
from prebake.artifacts.errors import UsageError
from prebake.engine.cli.common import command, json_option, positive_int, registry_option
from prebake.engine.common.probe import current_host
from prebake.engine.fleet.plan import make_plan
from prebake.engine.fleet.profiles import host_profile, render_toml


def add(sub) -> None:
    plan = command(
        sub,
        "plan",
        group="bake and plan",
        help="every target x kind of a recipe: present, missing, unknown or unbuildable",
        examples=[
            "prebake plan --model llama3-8b --missing-only",
            "prebake plan --model llama3-8b --json",
            "prebake plan --model llama3-8b --format github-matrix --profiles fleet.toml",
        ],
        store="read",
    )
    plan.add_argument("--model", required=True, help="recipe name (as `prebake recipes` lists them) or path")
    plan.add_argument("--precision", help="only this dtype (default: every dtype of the matrix)")
    plan.add_argument("--tp", type=positive_int, help="only this tensor-parallel size (default: every size)")
    registry_option(plan)
    profiles_option(plan)
    plan.add_argument("--missing-only", action="store_true", help="only targets some kind of which needs baking")
    plan.add_argument(
        "--format",
        choices=("table", "json", "github-matrix"),
        default="table",
        help="table for people, json (schema prebake.plan/1, the same as --json), or a GitHub Actions matrix "
        "(default: table)",
    )
    json_option(plan, "the plan (the same as --format json)")
    plan.set_defaults(run=cmd_plan)

    profile = command(sub, "profile", group="fleet", help="print this host's builder profile, for a profiles file")
    profile.add_argument("--name", help="the profile's name (default: the host's platform)")
    profile.add_argument("--label", action="append", default=[], help="a runner label (repeatable; default: none)")
    profile.set_defaults(run=cmd_profile)

    ray = command(
        sub, "ray-resources", group="fleet", help="print the --resources JSON a Ray node of this host advertises"
    )
    ray.set_defaults(run=cmd_ray_resources)


def profiles_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profiles",
        help="a profiles file (TOML, from `prebake profile`) keying other platforms' targets (default: $PREBAKE_PROFILES)",
    )


def plan_from_args(args: argparse.Namespace) -> FleetPlan:
    """The plan of args.model (narrowed by args.precision / args.tp) against args.registry."""
    return make_plan(args.model, precision=args.precision, tp=args.tp, registry=args.registry, profiles=args.profiles)


def cmd_plan(args: argparse.Namespace) -> int:
    fleet = plan_from_args(args)
    rows = fleet.missing() if args.missing_only else fleet.targets
    if args.json and args.format == "github-matrix":
        raise UsageError("--json and --format github-matrix ask for two outputs; give one of them")
    if args.format == "json" or args.json:
        print(json.dumps(fleet.to_json(rows, here=current_host().platform.describe()), indent=1))
    elif args.format == "github-matrix":
        print(json.dumps(github_matrix(rows), separators=(",", ":")))
    else:
        print(fleet.render(rows))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    host = current_host()
    p = host.platform
    name = args.name or (f"{p.device}-{p.arch}" if p.device != "gaudi" else p.arch).replace("+", "-")
    print(render_toml(host_profile(host, name, tuple(args.label))), end="")
    return 0


def cmd_ray_resources(args: argparse.Namespace) -> int:
    """The custom resource naming this host's matrix platform: `ray start --resources '<this>'`."""
    p = current_host().platform
    print(json.dumps(ray_resource(p.device, p.arch, p.device_count)))
    return 0
