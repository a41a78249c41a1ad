"""`prebake kernel-cache`: a vLLM target's baked graphs as a KServe/GKM kernel-cache image.

    prebake kernel-cache --model tiny-llama-vllm --precision bf16 --to oci://HOST/team/vllm-cache:TAG

The use case lives beside vLLM (engine/vllm/kernel_cache.py: checks, resolve, build, push); this
module parses the flags and prints its report.
"""

from __future__ import annotations

import argparse
import json
import sys

from prebake.artifacts.errors import ExitCode
from prebake.engine.cli.common import command, json_option, registry_option
from prebake.engine.common.advice import miss_exit_code


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
    from prebake.engine.compose import Context
    from prebake.engine.vllm.kernel_cache import KernelCacheRequest, NotBaked, push_kernel_cache

    request = KernelCacheRequest(
        model=args.model,
        to=args.to,
        precision=args.precision,
        tp=args.tp,
        runtime_image=args.runtime_image,
        model_uri=args.model_uri,
        cache_path=args.cache_path,
    )
    report = push_kernel_cache(request, lambda: Context.open(args.registry))
    if isinstance(report, NotBaked):
        print(report.render(), file=sys.stderr)
        if args.json:
            print(json.dumps(report.to_json(), indent=2))
        return int(miss_exit_code(list(report.misses)))
    print(json.dumps(report.to_json(), indent=2, sort_keys=True) if args.json else report.render())
    return int(ExitCode.OK)
