"""Start-up commands: fetch (install bundles, print the environment) and serve (start an engine)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from artifacts.errors import ExitCode, PrebakeError
from artifacts.fetch import Miss
from artifacts.recipes import load_recipe
from artifacts.stats import classify
from engine.cli.common import engine_options, registry_option, target_options


def add(sub) -> None:
    fetch = sub.add_parser("fetch", help="fetch, verify and install a recipe's bundles; print the environment")
    target_options(fetch)
    fetch.add_argument("--json", action="store_true", help="print JSON instead of shell exports")
    registry_option(fetch)
    engine_options(fetch)
    fetch.set_defaults(run=cmd_fetch)

    serve = sub.add_parser("serve", help="start the bundled engine from the recipe's bundles (compiling what misses)")
    target_options(serve)
    registry_option(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a container)"
    )
    serve.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default 8000)")
    serve.add_argument(
        "--on-miss",
        choices=("compile", "fail"),
        default="compile",
        help="when a bundle misses: compile in place (default) or exit 3",
    )
    serve.add_argument(
        "--api-key",
        help="require `Authorization: Bearer KEY` on every route but /health and /health/live "
        "(default: $PREBAKE_API_KEY; none: no authentication)",
    )
    serve.add_argument("--write-back", action="store_true", help="publish what was compiled in place to the registry")
    serve.add_argument(
        "--registry-timeout", type=float, default=5.0, help="seconds the registry lookup may take (default 5)"
    )
    serve.add_argument("--fetch-timeout", type=float, default=600.0, help="seconds downloads may take (default 600)")
    serve.add_argument(
        "--eager", action="store_true", help="compilation off: serve the eager model (the benchmark's floor)"
    )
    engine_options(serve)
    serve.add_argument(
        "--force-aot-load",
        action="store_true",
        help="with --engine vllm: strict loading (VLLM_FORCE_AOT_LOAD=1): vLLM exits when the baked AOT "
        "artifact does not load, instead of compiling again (targets where vLLM runs AOT compile: GPUs)",
    )
    serve.add_argument(
        "vllm_args", nargs="*", metavar="-- VLLM_ARGS", help="with --engine vllm: more `vllm serve` flags, after --"
    )
    serve.set_defaults(run=cmd_serve)


def _vllm_start(args: argparse.Namespace):
    from engine.startup.vllm import VllmStart

    return VllmStart(
        model=args.model,
        precision=args.precision,
        tp=args.tp,
        registry=args.registry,
        cache_root=args.cache_root,
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        on_miss=getattr(args, "on_miss", "compile"),
        write_back=getattr(args, "write_back", False),
        vllm_args=tuple(getattr(args, "vllm_args", ())),
        force_aot_load=getattr(args, "force_aot_load", False),
        **(
            {"registry_timeout": args.registry_timeout, "fetch_timeout": args.fetch_timeout}
            if hasattr(args, "registry_timeout")
            else {}
        ),
    )


def cmd_fetch_vllm(args: argparse.Namespace) -> int:
    """`fetch --engine vllm`: install, lay out a writable cache root, print vLLM's environment and flags."""
    import shlex

    from engine.startup.install import shell_exports
    from engine.startup.vllm import fetch_environment

    prepared = fetch_environment(_vllm_start(args))
    for miss in prepared.misses:
        print(miss.explain(), file=sys.stderr)
    for note in prepared.notes:
        print(f"prebake: {note}", file=sys.stderr)
    if args.json:
        payload = {
            "target": prepared.plan.target.name,
            "env": prepared.variables,
            "argv": list(prepared.argv),
            "cwd": str(prepared.cwd) if prepared.cwd else None,
            "complete": not prepared.misses,
            "misses": [miss_json(m) for m in prepared.misses],
        }
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(shell_exports(prepared.variables))
        print(
            f"# vLLM: {'cd ' + shlex.quote(str(prepared.cwd)) + ' && ' if prepared.cwd else ''}{shlex.join(prepared.argv)}"
        )
    return _miss_code(prepared.misses) if prepared.misses else 0


def cmd_fetch(args: argparse.Namespace) -> int:
    return FETCH_PATHS[args.engine](args)


def cmd_fetch_bundled(args: argparse.Namespace) -> int:
    """`fetch` for the bundled engine (and plain torch.compile users): the kinds' environment."""
    from engine.compose import Context
    from engine.startup.install import prebake_environment, shell_exports

    context = Context.open(args.registry)
    plan = context.pick_plan(load_recipe(args.model), dtype=args.precision, tp=args.tp)
    resolution = context.resolve(plan)
    if not resolution.complete:
        for miss in resolution.misses:
            print(miss.explain(), file=sys.stderr)
        print(f"prebake: no complete bundle set for {plan.target.name} in {context.address}", file=sys.stderr)
        if args.json:
            payload = {
                "target": plan.target.name,
                "complete": False,
                "misses": [miss_json(m) for m in resolution.misses],
            }
            print(json.dumps(payload, indent=2, sort_keys=True))
        return _miss_code(resolution.misses)
    env = prebake_environment(plan.kinds, resolution.installed)
    if args.json:
        payload = {
            "target": plan.target.name,
            "complete": True,
            "misses": [],
            "env": env,
            "bundles": {
                k: {"key": i.manifest.key_digest, "blob": i.manifest.blob.digest, "tree": str(i.tree)}
                for k, i in resolution.installed.items()
            },
        }
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(shell_exports(env))
    return 0


def _miss_code(misses: Sequence[Miss]) -> int:
    """3 when nothing usable was there (a miss, a registry fault); 2 when something was there and
    was refused (tampered, untrusted, corrupt or malformed): bad input, not a cold cache."""
    return ExitCode.INVALID if any(m.refused for m in misses) else ExitCode.MISS


def miss_json(miss: Miss) -> dict:
    """A miss in `fetch --json`: the key, why (and its short class), the nearest bundle and how it differs."""
    return {
        "kind": miss.key.kind,
        "key": miss.key.digest,
        "reason": miss.reason,
        "reason_class": classify(miss.reason),
        "refused": miss.refused,
        "nearest": miss.nearest.digest if miss.nearest is not None else None,
        "differing": {name: {"wanted": want, "nearest": have} for name, (want, have) in miss.differing.items()},
    }


def cmd_serve_vllm(args: argparse.Namespace) -> int:
    """`serve --engine vllm -- VLLM_ARGS`: fetch, install, then run vLLM from the installed graphs."""
    from engine.startup.vllm import serve

    return serve(_vllm_start(args), emit=lambda line: print(line, file=sys.stderr, flush=True))


def cmd_serve(args: argparse.Namespace) -> int:
    return SERVE_PATHS[args.engine](args)


def cmd_serve_bundled(args: argparse.Namespace) -> int:
    """`serve` with prebake's own engine, in this process."""
    if args.vllm_args:
        raise PrebakeError(f"flags after -- ({' '.join(args.vllm_args)}) are for --engine vllm only")
    if args.force_aot_load:
        raise PrebakeError(
            "--force-aot-load is vLLM's strict loading (--engine vllm); prebake's own engine refuses a start "
            "without its baked graphs with --on-miss fail"
        )
    from engine.runtime.server import ServeSettings, api_key_from, serve
    from engine.startup.bundled import StartupSettings

    startup = StartupSettings(
        model=args.model,
        precision=args.precision,
        tp=args.tp,
        registry=args.registry,
        registry_timeout=args.registry_timeout,
        fetch_timeout=args.fetch_timeout,
        on_miss=args.on_miss,
        write_back=args.write_back,
        eager=args.eager,
    )
    settings = ServeSettings(startup=startup, host=args.host, port=args.port, api_key=api_key_from(args.api_key))
    return serve(settings, emit=logging.getLogger("prebake.serve").info)


# The start path of each engine adapter (engine.adapters.ADAPTERS names them): the bundled engine
# serves in this process; vLLM (on any platform, Gaudi too) is started as its own process.
FETCH_PATHS = {"prebake": cmd_fetch_bundled, "vllm": cmd_fetch_vllm}
SERVE_PATHS = {"prebake": cmd_serve_bundled, "vllm": cmd_serve_vllm}
