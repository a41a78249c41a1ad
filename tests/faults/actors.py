"""The processes of the fault scenarios: each is `python -m tests.faults.actors <role> ...`.

Every role works on a real store (PREBAKE_HOME-style folder) and a real registry through
prebake's own code, under the trust policy of its environment (PREBAKE_POLICY, and
PREBAKE_SIGNING_KEY for a baker: the scenario's, tests/faults/in_force.py), prints one JSON
line saying what it saw, and exits. Scenarios run
several at once and kill them (from outside, or with PREBAKE_TEST_CRASH_AT from inside).

    fetch   fetch one bundle into a store; with --count, log every blob download to a file
    bake    bake the tiny-llama buckets artifact and publish it (prebake.artifacts.bake.bake_kind.bake_kind)
    hold    fetch a bundle and hold its tree with Store.use until killed
    churn   fetch then evict (gc to 0) the same bundle, over and over
    read    look a bundle up, hold it, check every file against its manifest, over and over
    publish publish a packed bundle, optionally with files capped at --fsize-limit bytes (a full disk)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.store.local import Store
from prebake.registry import open_registry
from prebake.registry.trust.policy import trust_in_force
from prebake.registry.trust.signing import signer_from_env
from tests.faults.checks import tree_problems


class CountingRegistry:
    """A registry that logs each blob download (one line per call, O_APPEND) and can be slow."""

    def __init__(self, inner, count_file: Path | None, delay_s: float):
        self.inner, self.count_file, self.delay_s = inner, count_file, delay_s
        self.url = inner.url

    def lookup(self, kind, key_digest):
        return self.inner.lookup(kind, key_digest)

    def list(self, kind=None):
        return self.inner.list(kind)

    def publish(self, manifest, blob):
        return self.inner.publish(manifest, blob)

    def fetch_blob(self, digest, dest, *, size=None, tee=None):
        if self.count_file is not None:
            with open(self.count_file, "a") as f:
                f.write(f"{os.getpid()} {digest}\n")
        time.sleep(self.delay_s)  # a download takes a while: the other fetchers must wait, not download too
        return self.inner.fetch_blob(digest, dest, size=size, tee=tee)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="actors")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--home", required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--kind", default="graphs")
    parser.add_argument("--key")
    parser.add_argument("--count", type=Path, help="file to log blob downloads to")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each blob download takes extra")
    parser.add_argument("--go", type=Path, help="wait for this file before starting: a barrier for racers")
    parser.add_argument("--ready", type=Path, help="write this file once the bundle is held")
    parser.add_argument("--build", default="first", help="bake: what makes this baker's build differ")
    parser.add_argument("--seconds", type=float, default=2.0, help="churn, read: how long to go on")
    parser.add_argument("--manifest", type=Path, help="publish: the manifest.json to publish")
    parser.add_argument("--blob", type=Path, help="publish: its payload")
    parser.add_argument("--fsize-limit", type=int, help="publish: no file this process writes may grow past this")
    args = parser.parse_args(argv)
    store = Store(args.home)
    registry = CountingRegistry(open_registry(args.registry), args.count, args.delay)
    trust = trust_in_force(address=registry.url, store_home=store.home, open_registry=lambda: registry, warn=False)
    if args.go is not None:
        _wait_for(args.go)
    result = ROLES[args.role](args, store, registry, trust)
    print(json.dumps({**result, "policy": trust is not None}), flush=True)
    return 0


def _fetch(args, store: Store, registry, trust) -> dict:
    manifest = registry.lookup(args.kind, args.key)
    if manifest is None:
        return {"miss": "no index entry"}
    got = fetch_key(store, registry, manifest.the_key(), trust=trust)
    if isinstance(got, Miss):
        return {"miss": got.reason}
    return {"tree": str(got.tree), "blob": got.manifest.blob.digest, "problems": tree_problems(got.tree, got.manifest)}


def _bake(args, store: Store, registry, trust) -> dict:
    from prebake.artifacts.bake.bake_kind import bake_kind
    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.common.probe import current_host
    from prebake.engine.compose import plans_for

    plan = plans_for(load_recipe("tiny-llama"), current_host())[0]

    def build_this(request) -> None:
        plan.kinds["buckets"].build(request)
        if args.build != "same":
            (request.out / "built-by.txt").write_text(args.build)

    sign = signer_from_env()
    baked = bake_kind(plan, "buckets", store=store, registry=registry, build=build_this, sign=sign, trust=trust)
    return {
        "created": baked.created,
        "note": baked.note,
        "blob": baked.manifest.blob.digest,
        "key": baked.manifest.key_digest,
        "tree": str(baked.installed.tree),
    }


def _hold(args, store: Store, registry, trust) -> dict:
    got = _fetch(args, store, registry, trust)
    installed = store.lookup(args.kind, args.key)
    with store.use(installed):
        args.ready.write_text(json.dumps(got))
        while True:  # until killed: an engine serving for its whole life
            time.sleep(3600)


def _churn(args, store: Store, registry, trust) -> dict:
    cycles, deadline = 0, time.monotonic() + args.seconds
    manifest = registry.lookup(args.kind, args.key)
    while time.monotonic() < deadline:
        fetch_key(store, registry, manifest.the_key(), trust=trust)
        store.gc(0)
        cycles += 1
    return {"cycles": cycles}


def _read(args, store: Store, registry, trust) -> dict:
    from prebake.artifacts.errors import StoreError

    seen = {"complete": 0, "nothing": 0, "evicted_before_held": 0, "partial": []}
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        installed = store.lookup(args.kind, args.key)
        if installed is None:
            seen["nothing"] += 1
            continue
        try:
            with store.use(installed):
                problems = tree_problems(installed.tree, installed.manifest)
        except StoreError:
            seen["evicted_before_held"] += 1
            continue
        if problems:
            seen["partial"].append(problems)
        else:
            seen["complete"] += 1
    return seen


def _publish(args, store: Store, registry, trust) -> dict:
    import resource
    import signal

    from prebake.artifacts.bundle.manifest import Manifest
    from prebake.artifacts.ports.errors import RegistryError

    manifest = Manifest.read(args.manifest)
    if args.fsize_limit is not None:  # as a full disk would: writes past the cap fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_limit, args.fsize_limit))
    try:
        published = registry.publish(manifest, args.blob)
    except RegistryError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"created": published.created}


def _wait_for(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.005)


ROLES = {"fetch": _fetch, "bake": _bake, "hold": _hold, "churn": _churn, "read": _read, "publish": _publish}

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
