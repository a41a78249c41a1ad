"""`prebake bake`: the tasks of `doit bake`, installed; one target, or the whole matrix on a Ray cluster.

prebake bake --model M [--precision P] [--tp N] [--registry R]     what this host builds
prebake bake --model M --target <id> [--registry R]                one planned target
prebake bake --model M --executor ray [--ray-address ADDR]         every missing target, on matching nodes
"""

from __future__ import annotations

import argparse

from prebake.artifacts.bake.tasks import BakeRequest
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.cli.common import command, positive_int, registry_option
from prebake.engine.cli.plan import profiles_option


def add(sub) -> None:
    bake = command(
        sub,
        "bake",
        group="bake and plan",
        help="bake a recipe's artifacts (doit's tasks) and publish them",
        examples=[
            "prebake bake --model tiny-llama --precision bf16",
            "prebake bake --model llama3-8b --target llama3-8b/cuda:sm_90/tp8/fp8 --registry s3://team/prebake",
            "prebake bake --model llama3-8b --executor ray --ray-address ray://head:10001",
        ],
        store="write",
    )
    bake.add_argument(
        "--model", required=True, help="recipe name (as `prebake recipes` lists them; PREBAKE_RECIPES adds folders)"
    )
    bake.add_argument("--precision", help="only this dtype (default: every dtype of the matrix this host builds)")
    bake.add_argument("--tp", type=positive_int, help="only this tensor-parallel size (default: every size)")
    bake.add_argument("--target", help="bake exactly this target id, as `prebake plan` prints it (default: all)")
    registry_option(bake)
    bake.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where the bakes run: this host, or a Ray cluster's matching nodes (default: local)",
    )
    bake.add_argument("--ray-address", help="with --executor ray: the cluster (default: RAY_ADDRESS, else a local one)")
    bake.add_argument(
        "--node-timeout",
        type=float,
        default=120.0,
        help="with --executor ray: seconds to wait for a matching node (default: 120)",
    )
    bake.add_argument(
        "--ray-routing",
        choices=("resource", "accelerator"),
        default="resource",
        help="with --executor ray: place bakes by the custom resource `prebake ray-resources` prints (default), "
        "or by Ray's GPU accelerator_type / HPU count",
    )
    bake.add_argument(
        "--ray-retries", type=int, default=2, help="with --executor ray: retries of a bake whose node died (default 2)"
    )
    bake.add_argument(
        "--forward-credentials",
        action="store_true",
        help="with --executor ray: also send this host's registry credentials (AWS_*, HF_TOKEN) to the nodes; "
        "without it only the non-secret settings travel (endpoint, region, HF_ENDPOINT, PREBAKE_*)",
    )
    profiles_option(bake)
    bake.add_argument("--always", action="store_true", help="rebuild even what the registry already has (doit -a)")
    bake.set_defaults(run=cmd_bake)


def cmd_bake(args: argparse.Namespace) -> int:
    if args.executor == "ray":
        from prebake.engine.fleet.ray_executor import RayBake, bake_on_ray

        report = bake_on_ray(
            RayBake(
                model=args.model,
                precision=args.precision,
                tp=args.tp,
                registry=args.registry,
                profiles=args.profiles,
                address=args.ray_address,
                routing=args.ray_routing,
                retries=args.ray_retries,
                node_timeout=args.node_timeout,
                forward_credentials=args.forward_credentials,
            )
        )
        print(report.render())
        return 1 if report.failed else 0
    from prebake.engine.fleet.local import bake_locally, parse_target, request_for_target

    if args.target:
        target = parse_target(load_recipe(args.model), args.target)
        request = request_for_target(args.model, target, args.registry)
    else:
        request = BakeRequest(model=args.model, precision=args.precision, tp=args.tp, registry=args.registry)
    return bake_locally(request, doit_args=["-a"] if args.always else ())
