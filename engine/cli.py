"""The `prebake` command: list, fetch, serve, verify and manage bundles.

Exit codes: 0 success, 2 bad input (unknown model, malformed recipe, bad registry
address), 3 a miss (`fetch` found no matching bundle; the nearest one is explained);
`verify` exits 1 when it found bad entries.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from artifacts.errors import PrebakeError
from artifacts.recipes import load_recipe
from artifacts.store import Store

EXIT_MISS = 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except PrebakeError as exc:
        print(f"prebake: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prebake", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    ls = sub.add_parser("ls", help="list the bundles in a registry")
    _registry_option(ls)
    ls.add_argument("--kind", help="only this artifact kind (buckets, autotune, graphs)")
    ls.set_defaults(run=cmd_ls)

    fetch = sub.add_parser("fetch", help="fetch, verify and install a recipe's bundles; print the environment")
    _target_options(fetch)
    fetch.add_argument("--json", action="store_true", help="print JSON instead of shell exports")
    _registry_option(fetch)
    _engine_options(fetch)
    fetch.set_defaults(run=cmd_fetch)

    keygen = sub.add_parser("keygen", help="make an ed25519 signing key pair for bundles")
    keygen.add_argument("name", help="the signer's name, e.g. ci-bakers-2026")
    keygen.add_argument("--dir", default=".", help="folder to write <name>.pem and <name>.pub into")
    keygen.set_defaults(run=cmd_keygen)

    verify = sub.add_parser("verify", help="re-hash every blob and check every index entry and signature")
    _registry_option(verify)
    verify.add_argument("--quarantine", action="store_true", help="move bad entries aside")
    verify.set_defaults(run=cmd_verify)

    gc = sub.add_parser("gc", help="evict least recently used bundles from the local store; never one in use")
    gc.add_argument("--max-size", help="how large the store may be, e.g. 10G or 500M (default: $PREBAKE_STORE_MAX_BYTES)")
    gc.set_defaults(run=cmd_gc)

    serve = sub.add_parser("serve", help="start the bundled engine from the recipe's bundles (compiling what misses)")
    _target_options(serve)
    _registry_option(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default 8000)")
    serve.add_argument("--on-miss", choices=("compile", "fail"), default="compile",
                       help="when a bundle misses: compile in place (default) or exit 3")
    serve.add_argument("--write-back", action="store_true", help="publish what was compiled in place to the registry")
    serve.add_argument("--registry-timeout", type=float, default=5.0, help="seconds the registry lookup may take (default 5)")
    serve.add_argument("--fetch-timeout", type=float, default=600.0, help="seconds downloads may take (default 600)")
    serve.add_argument("--eager", action="store_true", help="compilation off: serve the eager model (the benchmark's floor)")
    _engine_options(serve)
    serve.add_argument("vllm_args", nargs="*", metavar="-- VLLM_ARGS",
                       help="with --engine vllm: more `vllm serve` flags, after --")
    serve.set_defaults(run=cmd_serve)
    return parser


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="recipe name (recipes/<name>.toml) or path")
    parser.add_argument("--precision", help="dtype to serve (default: the recipe's first buildable one)")
    parser.add_argument("--tp", type=int, help="tensor-parallel size (default: the smallest baked)")


def _registry_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry",
        help="registry address: a folder, file://, s3://bucket/prefix, hf://ns/repo, or a comma list "
        "(default: $PREBAKE_REGISTRY, else $PREBAKE_HOME/registry)",
    )


def cmd_ls(args: argparse.Namespace) -> int:
    from registry import open_registry

    store = Store()
    registry = open_registry(store.registry_address(args.registry))
    rows = [_ls_row(m) for m in registry.list(args.kind)]
    headers = ("MODEL", "KIND", "PLATFORM", "PRECISION", "TP", "SIZE", "CREATED", "KEY")
    print(_table(headers, rows) if rows else f"no bundles in {registry.url}")
    return 0


def _engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("prebake", "vllm"), default="prebake",
                        help="the engine to serve with: prebake's own (default) or vLLM (recipes with engine = 'vllm')")
    parser.add_argument("--cache-root", type=Path,
                        help="with --engine vllm: a local folder for this vLLM's writable cache copy "
                        "(default: a fresh one under $PREBAKE_HOME/engines/vllm)")


def _vllm_start(args: argparse.Namespace):
    from engine.adapters.vllm_serve import VllmStart

    return VllmStart(
        model=args.model, precision=args.precision, tp=args.tp, registry=args.registry, cache_root=args.cache_root,
        host=getattr(args, "host", None), port=getattr(args, "port", None),
        on_miss=getattr(args, "on_miss", "compile"), write_back=getattr(args, "write_back", False),
        vllm_args=tuple(getattr(args, "vllm_args", ())),
        **({"time_box_s": args.registry_timeout + args.fetch_timeout} if hasattr(args, "registry_timeout") else {}),
    )


def cmd_fetch_vllm(args: argparse.Namespace) -> int:
    """`fetch --engine vllm`: install, lay out a writable cache root, print vLLM's environment and flags."""
    import shlex

    from engine.adapters.vllm_serve import fetch_environment
    from engine.install import shell_exports

    prepared = fetch_environment(_vllm_start(args))
    for miss in prepared.misses:
        print(miss.explain(), file=sys.stderr)
    for note in prepared.notes:
        print(f"prebake: {note}", file=sys.stderr)
    if args.json:
        payload = {"target": prepared.plan.target.name, "env": prepared.variables, "argv": list(prepared.argv),
                   "cwd": str(prepared.cwd) if prepared.cwd else None, "complete": not prepared.misses}
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(shell_exports(prepared.variables))
        print(f"# vLLM: {'cd ' + shlex.quote(str(prepared.cwd)) + ' && ' if prepared.cwd else ''}{shlex.join(prepared.argv)}")
    return EXIT_MISS if prepared.misses else 0


def cmd_fetch(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return cmd_fetch_vllm(args)
    from engine.install import prebake_environment, shell_exports
    from engine.probe import current_host
    from engine.resolve import pick_plan, resolve
    from registry import open_registry
    from registry.signing import trust_from_env

    store = Store()
    registry = open_registry(store.registry_address(args.registry))
    plan = pick_plan(load_recipe(args.model), current_host(), dtype=args.precision, tp=args.tp)
    resolution = resolve(plan, store=store, registry=registry, trust=trust_from_env())
    if not resolution.complete:
        for miss in resolution.misses:
            print(miss.explain(), file=sys.stderr)
        print(f"prebake: no complete bundle set for {plan.target.name} in {registry.url}", file=sys.stderr)
        return EXIT_MISS
    env = prebake_environment(resolution.installed)
    if args.json:
        payload = {
            "target": plan.target.name,
            "env": env,
            "bundles": {k: {"key": i.manifest.key_digest, "blob": i.manifest.blob.digest, "tree": str(i.tree)}
                        for k, i in resolution.installed.items()},
        }
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(shell_exports(env))
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from registry.signing import keygen_cli

    print(keygen_cli(args.name, Path(args.dir).resolve()))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from registry import open_registry
    from registry.signing import trust_from_env
    from registry.verify import verify_registry

    registry = open_registry(Store().registry_address(args.registry))
    report = verify_registry(registry, trust=trust_from_env(), quarantine=args.quarantine)
    print(report.render())
    return report.exit_code


def cmd_gc(args: argparse.Namespace) -> int:
    from artifacts.errors import StoreError
    from artifacts.store import parse_size

    store = Store()
    bound = parse_size(args.max_size, "--max-size") if args.max_size else store.limits.max_bytes
    if bound is None:
        raise StoreError("say how large the store may be: prebake gc --max-size 10G, or set PREBAKE_STORE_MAX_BYTES")
    print(store.gc(bound).render())
    return 0


def cmd_serve_vllm(args: argparse.Namespace) -> int:
    """`serve --engine vllm -- VLLM_ARGS`: fetch, install, then run vLLM from the installed graphs."""
    from engine.adapters.vllm_serve import serve

    return serve(_vllm_start(args), emit=lambda line: print(line, file=sys.stderr, flush=True))


def cmd_serve(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return cmd_serve_vllm(args)
    if args.vllm_args:
        raise PrebakeError(f"flags after -- ({' '.join(args.vllm_args)}) are for --engine vllm only")
    from engine.server import ServeSettings, serve
    from engine.startup import StartupSettings

    startup = StartupSettings(
        model=args.model, precision=args.precision, tp=args.tp, registry=args.registry,
        registry_timeout=args.registry_timeout, fetch_timeout=args.fetch_timeout, on_miss=args.on_miss,
        write_back=args.write_back, eager=args.eager,
    )
    settings = ServeSettings(startup=startup, host=args.host, port=args.port)
    return serve(settings, emit=lambda line: print(line, file=sys.stderr, flush=True))


def _ls_row(m) -> tuple[str, ...]:
    labels = m.labels
    return (
        labels.get("model", "?"), m.kind, labels.get("platform", "?"), labels.get("precision", "-"),
        labels.get("tp", "-"), _size(m.blob.size), m.created, m.key_digest[:16],
    )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r).rstrip() for r in [headers, *rows])


if __name__ == "__main__":
    sys.exit(main())
