"""Start-up commands: fetch (install bundles, print the environment) and serve (start an engine)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from prebake.engine.adapters import adapter_named, start_options
from prebake.engine.cli.common import command, engine_options, json_option, registry_option, target_options
from prebake.engine.common.adapter import FETCH_TIMEOUT_S, REGISTRY_TIMEOUT_S, Fetched, StartRequest
from prebake.engine.common.advice import bake_command, miss_advice, miss_exit_code
from prebake.engine.common.exports import shell_exports


def add(sub) -> None:
    fetch = command(
        sub,
        "fetch",
        group="serve",
        help="fetch, verify and install a recipe's bundles; print the environment",
        examples=[
            "prebake fetch --model tiny-llama --precision bf16",
            'eval "$(prebake fetch --model tiny-llama --precision bf16)"',
            "prebake fetch --model tiny-llama --registry s3://team/prebake --registry-timeout 10 --json",
        ],
        store="serve",
    )
    target_options(fetch)
    json_option(fetch, "the environment and the bundles (or the misses)")
    registry_option(fetch)
    timeout_options(fetch, registry_timeout=REGISTRY_TIMEOUT_S["fetch"])
    engine_options(fetch, "fetch")
    fetch.set_defaults(run=cmd_fetch, start_command="fetch")

    serve = command(
        sub,
        "serve",
        group="serve",
        help="start the bundled engine from the recipe's bundles (compiling what misses)",
        examples=[
            "prebake serve --model tiny-llama --precision bf16",
            "prebake serve --model tiny-llama --host 0.0.0.0 --port 8080 --on-miss fail",
            "prebake serve --model tiny-llama-vllm --engine vllm -- --max-model-len 512",
        ],
        store="serve",
    )
    target_options(serve)
    registry_option(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a container)"
    )
    serve.add_argument(
        "--port",
        type=port_number,
        default=8000,
        help="port to listen on, 0 to 65535; 0 picks a free one (default 8000)",
    )
    serve.add_argument(
        "--on-miss",
        choices=("compile", "fail"),
        default="compile",
        help="when a bundle misses: compile in place (default) or exit (3 nothing matches, 4 registry unavailable)",
    )
    serve.add_argument("--write-back", action="store_true", help="publish what was compiled in place to the registry")
    timeout_options(serve, registry_timeout=REGISTRY_TIMEOUT_S["serve"])
    engine_options(serve, "serve")  # --engine, --mounted, and each engine's own (its EngineSpec's options)
    serve.set_defaults(run=cmd_serve, start_command="serve")


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: give 0 to 65535 (0 picks a free one)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} seconds: give a time box above 0")
    return value


def timeout_options(parser: argparse.ArgumentParser, *, registry_timeout: float) -> None:
    """The time boxes of fetch and serve: the same flags (serve's lookup default is shorter: it
    compiles when the registry is slow, while fetch has nothing else to do)."""
    parser.add_argument(
        "--registry-timeout",
        type=_seconds,
        default=registry_timeout,
        help="seconds opening the registry and looking every kind up may take; then it counts as unavailable "
        f"(default {registry_timeout:g})",
    )
    parser.add_argument(
        "--fetch-timeout",
        type=_seconds,
        default=FETCH_TIMEOUT_S,
        help=f"seconds the downloads may take (default {FETCH_TIMEOUT_S:g})",
    )


def start_request(args: argparse.Namespace) -> StartRequest:
    """What `fetch` or `serve` asks of the engine, from the command line (fetch has no listener;
    the registry is the composition root's, opened by `Context.open(args.registry)`). The
    engines' own flags travel as options, the given ones only: the engine refuses those it does not take."""
    defaults = StartRequest(model=args.model)
    given = {option.name: getattr(args, option.name) for _, option in start_options(args.start_command)}
    return StartRequest(
        model=args.model,
        precision=args.precision,
        tp=args.tp,
        registry_timeout=getattr(args, "registry_timeout", defaults.registry_timeout),
        fetch_timeout=getattr(args, "fetch_timeout", defaults.fetch_timeout),
        on_miss=getattr(args, "on_miss", "compile"),
        write_back=getattr(args, "write_back", False),
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        mounted=tuple(getattr(args, "mounted", ())),
        engine=args.engine,
        options={name: tuple(value) if isinstance(value, list) else value for name, value in given.items() if value},
    )


def cmd_fetch(args: argparse.Namespace) -> int:
    """`fetch`: the engine's adapter installs what matches; this prints its environment (and the
    command line of an engine started as its own process)."""
    from prebake.engine.compose import Context

    context = Context.open(args.registry)
    with context.holds:  # every tree held until its path is printed: no gc (its own included) takes one before
        fetched = adapter_named(args.engine).fetch(start_request(args), context)
        _print_fetched(args, fetched, context.address)
    return miss_exit_code(fetched.misses)


def _print_fetched(args: argparse.Namespace, fetched: Fetched, address: str) -> None:
    for miss in fetched.misses:
        print(miss.explain(), file=sys.stderr)
    for note in fetched.notes:
        print(f"prebake: {note}", file=sys.stderr)
    advice = None
    if fetched.misses:
        bake = bake_command(args.model, args.precision or None)
        advice = miss_advice(fetched.misses, target=fetched.target, bake=bake, address=address)
        print(f"prebake: {advice}", file=sys.stderr)
    if args.json:
        print(json.dumps(fetched.to_json(advice), indent=2, sort_keys=True))
    elif fetched.env or fetched.argv:
        print(shell_exports(fetched.env))
        if fetched.argv:
            cd = f"cd {shlex.quote(str(fetched.cwd))} && " if fetched.cwd else ""
            print(f"# {args.engine}: {cd}{shlex.join(fetched.argv)}")
    sys.stdout.flush()  # out while the trees are still held


def cmd_serve(args: argparse.Namespace) -> int:
    """`serve`: the engine's adapter starts it from the bundles (compiling what misses)."""
    from prebake.engine.compose import Context

    return adapter_named(args.engine).serve(start_request(args), lambda: Context.open(args.registry))
