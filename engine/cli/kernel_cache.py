"""`prebake kernel-cache`: a vLLM target's baked graphs as a KServe/GKM kernel-cache image.

    prebake kernel-cache --model tiny-llama-vllm --precision bf16 --to oci://HOST/team/vllm-cache:TAG

The graphs bundle is fetched through the pipeline (lookup, the trust policy in force, install),
checked to hold every tensor-parallel rank's compile cache (prebake.engine.vllm.ranks), and the
image built from the installed tree and its signed manifest (registry/oci/kernel_cache.py) is
pushed with prebake's OCI client.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import TYPE_CHECKING

from prebake.artifacts.errors import ExitCode, PrebakeError
from prebake.engine.cli.common import command, json_option, registry_option
from prebake.engine.common.advice import miss_exit_code

if TYPE_CHECKING:
    from prebake.artifacts.store.local import Installed


def add(sub) -> None:
    kc = command(
        sub,
        "kernel-cache",
        group="registry",
        help="push a vLLM target's baked compile cache as a kernel-cache image KServe's KernelCache and GKM mount",
        examples=[
            "prebake kernel-cache --model tiny-llama-vllm --precision bf16 --to oci://registry.local/team/vllm-cache:tiny",
            "prebake kernel-cache --model llama3-8b-vllm --to oci://ghcr.io/acme/kc:llama3 "
            "--runtime-image vllm/vllm-openai:v0.32.0 --model-uri hf://meta-llama/Llama-3.1-8B --json",
        ],
        store="write",
    )
    kc.add_argument("--model", required=True, help="recipe name (a recipe with engine = 'vllm')")
    kc.add_argument("--precision", help="the dtype of the target (default: the one `prebake fetch` picks)")
    kc.add_argument("--tp", type=int, help="the tensor parallel size of the target (default: the smallest baked)")
    registry_option(kc)
    kc.add_argument(
        "--to", required=True, metavar="oci://HOST/REPO:TAG", help="where the image goes (any distribution registry)"
    )
    kc.add_argument(
        "--runtime-image",
        metavar="IMAGE",
        help="with --model-uri: the vLLM image the InferenceService runs, so the "
        "image also carries the compatibility footprint KServe computes for it",
    )
    kc.add_argument("--model-uri", metavar="URI", help="with --runtime-image: the InferenceService's storageUri")
    kc.add_argument(
        "--cache-path",
        default="/root/.cache/vllm",
        metavar="PATH",
        help="the serving container's VLLM_CACHE_ROOT, where KServe links the cache (the KernelCache's "
        "containerPath): the absolute paths vLLM wrote into the cache are rewritten to it (default: %(default)s, "
        "KServe's fallback)",
    )
    json_option(kc)
    kc.set_defaults(run=cmd_kernel_cache)


def cmd_kernel_cache(args: argparse.Namespace) -> int:
    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.compose import Context
    from prebake.registry.oci.kernel_cache import build_image, push_image

    address, _, tag = args.to.rpartition(":")
    if not address.startswith("oci://") or "/" in tag or not tag:
        raise PrebakeError(f"--to {args.to!r}: write oci://HOST[:PORT]/NAMESPACE/REPO:TAG")
    if bool(args.runtime_image) != bool(args.model_uri):
        raise PrebakeError("--runtime-image and --model-uri go together: KServe's footprint needs both")
    recipe = load_recipe(args.model)
    if recipe.model.engine != "vllm":
        raise PrebakeError(
            f"recipe {args.model} is for the {recipe.model.engine} engine; kernel-cache images hold vLLM's compile "
            f"cache: name a recipe with engine = 'vllm' (prebake recipes lists them)"
        )
    context = Context.open(args.registry)
    plan = context.pick_plan(recipe, dtype=args.precision, tp=args.tp)
    with context.holds:
        resolution = context.resolve(plan, kinds=["graphs"])
        if "graphs" not in resolution.installed:
            from prebake.engine.cli.serving import miss_json

            for miss in resolution.misses:
                print(miss.explain(), file=sys.stderr)
            print(f"prebake: bake it first: doit bake model={args.model}", file=sys.stderr)
            if args.json:
                print(json.dumps({"complete": False, "misses": [miss_json(m) for m in resolution.misses]}, indent=2))
            return int(miss_exit_code(resolution.misses))
        installed = resolution.installed["graphs"]
        ranks = checked_ranks(installed, plan.target.tp)
        scratch = context.store.scratch(f"kernel-cache-{installed.manifest.key_digest[:16]}")
        try:
            image = build_image(
                installed.tree,
                installed.manifest,
                scratch,
                runtime_image=args.runtime_image,
                model_uri=args.model_uri,
                cache_path=args.cache_path,
                ranks=ranks,
            )
            digest = push_image(image, address, tag)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    report = {
        "ranks": list(ranks),
        "image": f"{address.removeprefix('oci://')}@{digest}",
        "tag": f"{address.removeprefix('oci://')}:{tag}",
        "target": plan.target.name,
        "key": installed.manifest.key_digest,
        "labels": image.labels,
        "factors": image.factors,
        "compatibilityFootprint": image.compatibility_footprint,
    }
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(f"prebake: {plan.target.name} graphs -> {report['tag']} ({report['image']})")
        for name, value in sorted(image.factors.items()):
            print(f"  {name} = {value}")
    return int(ExitCode.OK)


def checked_ranks(installed: Installed, tp: int) -> tuple[int, ...]:
    """The ranks 0..tp-1, once the installed tree is checked to hold each one's compile cache
    (prebake.engine.vllm.ranks); an image a rank could not start from is refused, the rank named."""
    from prebake.engine.vllm.process import CACHE_DIR, read_report
    from prebake.engine.vllm.ranks import describe, gaps

    found = gaps(installed.tree / CACHE_DIR, tp, read_report(installed.tree).get("ranks"))
    if found:
        raise PrebakeError(
            f"graphs {installed.manifest.key_digest[:16]} is baked for tp={tp}, but {describe(found)}; "
            f"no kernel-cache image is made from it: rebake it (doit bake model=... tp={tp}) and push again"
        )
    return tuple(range(tp))
