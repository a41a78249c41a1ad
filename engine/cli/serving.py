"""Start-up commands: fetch (install bundles, print the environment) and serve (start an engine)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence

from prebake.artifacts.bake.fetch import Miss
from prebake.artifacts.errors import ExitCode
from prebake.artifacts.store.stats import classify
from prebake.engine.adapters import adapter_named
from prebake.engine.cli.common import engine_options, registry_option, target_options
from prebake.engine.common.adapter import Fetched, StartRequest
from prebake.engine.common.exports import shell_exports


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


def start_request(args: argparse.Namespace) -> StartRequest:
    """What `fetch` or `serve` asks of the engine, from the command line (fetch has no listener)."""
    defaults = StartRequest(model=args.model)
    return StartRequest(
        model=args.model,
        precision=args.precision,
        tp=args.tp,
        registry=args.registry,
        registry_timeout=getattr(args, "registry_timeout", defaults.registry_timeout),
        fetch_timeout=getattr(args, "fetch_timeout", defaults.fetch_timeout),
        on_miss=getattr(args, "on_miss", "compile"),
        write_back=getattr(args, "write_back", False),
        eager=getattr(args, "eager", False),
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        api_key=getattr(args, "api_key", None),
        cache_root=args.cache_root,
        engine_args=tuple(getattr(args, "vllm_args", ())),
        force_aot_load=getattr(args, "force_aot_load", False),
    )


def cmd_fetch(args: argparse.Namespace) -> int:
    """`fetch`: the engine's adapter installs what matches; this prints its environment (and the
    command line of an engine started as its own process)."""
    from prebake.engine.compose import Context

    fetched = adapter_named(args.engine).fetch(start_request(args), Context.open(args.registry))
    for miss in fetched.misses:
        print(miss.explain(), file=sys.stderr)
    for note in fetched.notes:
        print(f"prebake: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(fetch_json(fetched), indent=2, sort_keys=True))
    elif fetched.env or fetched.argv:
        print(shell_exports(fetched.env))
        if fetched.argv:
            cd = f"cd {shlex.quote(str(fetched.cwd))} && " if fetched.cwd else ""
            print(f"# {args.engine}: {cd}{shlex.join(fetched.argv)}")
    return _miss_code(fetched.misses) if fetched.misses else 0


def fetch_json(fetched: Fetched) -> dict:
    """`fetch --json`: the target, whether every kind was installed, the misses, the environment,
    the installed bundles, and an engine process's command line where there is one."""
    payload: dict = {
        "target": fetched.target,
        "complete": not fetched.misses,
        "misses": [miss_json(m) for m in fetched.misses],
        "env": fetched.env,
        "bundles": {
            k: {"key": i.manifest.key_digest, "blob": i.manifest.blob.digest, "tree": str(i.tree)}
            for k, i in fetched.installed.items()
        },
    }
    if fetched.argv:
        payload |= {"argv": list(fetched.argv), "cwd": str(fetched.cwd) if fetched.cwd else None}
    return payload


def cmd_serve(args: argparse.Namespace) -> int:
    """`serve`: the engine's adapter starts it from the bundles (compiling what misses)."""
    from prebake.engine.compose import Context

    return adapter_named(args.engine).serve(start_request(args), lambda: Context.open(args.registry))


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
