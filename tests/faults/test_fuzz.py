"""Fuzzing fetch and verify with what a hostile registry could hold, for a bounded time.

A seeded generator (PREBAKE_FUZZ_SEED, default fixed; PREBAKE_FUZZ_SECONDS, default 15)
mutates a real bundle in three ways and plants each result in a folder registry:

    manifest text     bytes flipped, cut, or spliced in the index entry's JSON
    manifest fields   one field replaced by a hostile value (deep nesting, huge or negative
                      numbers, '..', NUL, absolute paths, 300-byte names, wrong types)
    archive           the blob cut, bytes flipped, or its tar headers edited and recompressed;
                      half the time the manifest is re-pointed at the mutated blob's digest, so
                      the unpacker, not the digest check, is what must refuse it

Every case runs under the policy in force (tests/faults/in_force.py), and every mutant that still
reads as a manifest is signed with the key that policy trusts, so the checks behind the signature
are what each case reaches. After each case: lookup, fetch and a deep verify either succeed or
raise prebake's own errors (never anything else, never a hang); an install that succeeded is
whole and matches its manifest; the store holds nothing that `verify --store` finds wrong and no
leftovers.
"""

from __future__ import annotations

import io
import json
import os
import random
import time
from pathlib import Path

import zstandard

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.unpack import tree_problems
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.keys import Key
from prebake.artifacts.store.admin import verify_store
from prebake.artifacts.store.local import Store
from prebake.registry.backends.file import FileRegistry
from prebake.registry.review.verify import verify_registry
from tests.faults.procs import unbounded

SEED = int(os.environ.get("PREBAKE_FUZZ_SEED", "20261130"))
SECONDS = float(os.environ.get("PREBAKE_FUZZ_SECONDS", "15"))

_HOSTILE_VALUES = [
    None,
    -1,
    1 << 70,
    "",
    "../../etc/passwd",
    "/abs/path",
    "a\x00b",
    "x" * 300,
    [],
    {},
    [[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]],
    {"a": {"b": {"c": {"d": {"e": {}}}}}},
    "sha256:" + "0" * 64,
    True,
    3.5,
]


def test_random_manifests_and_archives_never_crash_fetch_or_verify(tmp_path, scenario, in_force):
    rng = random.Random(SEED)
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=32 << 10)
    good_blob = bundle.blob.read_bytes()
    good_tar = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(good_blob)).read()
    deadline, cases, installed = time.monotonic() + SECONDS, 0, 0
    while time.monotonic() < deadline:
        cases += 1
        case_dir = tmp_path / f"case-{cases}"
        raw, blob = _mutant(rng, bundle.manifest, good_blob, good_tar, cases)
        root = case_dir / "registry"
        key_digest = _plant(root, _signed(in_force, raw), blob, bundle.manifest)
        home = scenario.store(case_dir / "home") if cases <= 3 else case_dir / "home"
        installed += _exercise(root, home, key_digest, SEED, cases, in_force)
    assert cases >= 10, f"only {cases} cases ran in {SECONDS} s"
    print(f"fuzz: {cases} cases (seed {SEED}), {installed} installed whole, the rest refused cleanly")


def _signed(in_force, raw: bytes) -> bytes:
    """The mutant signed with the trusted key when it still reads as a manifest, else as it is."""
    try:
        return in_force.sign(Manifest.parse(raw, "a fuzz case")).to_bytes()
    except PrebakeError:
        return raw


def _exercise(root: Path, home: Path, key_digest: str, seed: int, case: int, in_force) -> int:
    """Lookup, fetch and verify one planted case under the policy; 1 if it installed (whole), else 0."""
    where = f"seed {seed} case {case}"
    registry = FileRegistry(root)
    store = unbounded(home)
    trust = in_force.trust(registry, home)
    got = None
    try:
        manifest = registry.lookup("graphs", key_digest)
        if manifest is not None:
            got = fetch_key(store, registry, manifest.the_key(), trust=trust)
    except PrebakeError:
        pass
    except Exception as exc:  # the very thing this test exists to catch
        raise AssertionError(f"{where}: fetch raised {type(exc).__name__}: {exc}") from exc
    try:
        verify_registry(registry, trust=trust, quarantine=False, deep=True)
    except Exception as exc:
        raise AssertionError(f"{where}: verify raised {type(exc).__name__}: {exc}") from exc
    assert verify_store(Store(home)).findings == (), f"{where}: the store holds something wrong"
    leftovers = [p.name for p in home.rglob("*") if p.name.endswith(".partial") or p.name.startswith(".tmp-")]
    assert leftovers == [], f"{where}: left {leftovers}"
    if got is not None and not isinstance(got, Miss):
        assert tree_problems(got.tree, got.manifest.files) == [], f"{where}: installed a tree that is not whole"
        return 1
    return 0


def _mutant(rng: random.Random, base: Manifest, blob: bytes, tar: bytes, case: int) -> tuple[bytes, bytes]:
    """(index entry bytes, blob bytes) for one case."""
    doc = json.loads(base.to_bytes())
    what = rng.choice(["text", "field", "field", "archive", "archive", "archive"])
    if what == "text":
        return _mutate_bytes(rng, base.to_bytes(), rounds=rng.randint(1, 4)), blob
    if what == "field":
        _replace_somewhere(rng, doc)
        return json.dumps(doc).encode(), blob
    if rng.random() < 0.5:
        mutated = _mutate_bytes(rng, blob, rounds=rng.randint(1, 3))
    else:
        mutated = zstandard.ZstdCompressor(level=1).compress(_mutate_tar(rng, tar))
    if rng.random() < 0.5:  # consistent with the mutant: only the unpacker stands in the way
        import hashlib

        doc["blob"] = {"digest": "sha256:" + hashlib.sha256(mutated).hexdigest(), "size": len(mutated)}
    return json.dumps(doc).encode(), mutated


def _mutate_bytes(rng: random.Random, data: bytes, rounds: int) -> bytes:
    out = bytearray(data)
    for _ in range(rounds):
        op = rng.choice(["flip", "cut", "splice", "zero"])
        at = rng.randrange(max(len(out), 1))
        if op == "flip" and out:
            out[at] ^= 1 << rng.randrange(8)
        elif op == "cut":
            del out[at:]
        elif op == "splice":
            out[at:at] = rng.randbytes(rng.randint(1, 64))
        elif out:
            out[at : at + rng.randint(1, 600)] = bytes(min(len(out) - at, rng.randint(1, 600)))
    return bytes(out)


def _mutate_tar(rng: random.Random, tar: bytes) -> bytes:
    """Edit a tar header field (name, size, type, link name, checksum) or the data after it."""
    out = bytearray(tar)
    headers = [i for i in range(0, len(out) - 512, 512) if out[i + 257 : i + 262] == b"ustar"]
    at = rng.choice(headers) if headers else 0
    field = rng.choice([(0, 100), (124, 136), (156, 157), (157, 257), (148, 156), (512, 1024)])
    value = rng.choice([b"../x", b"/etc/passwd", b"77777777777", b"2", b"1", b"5", b"\x80" + b"\xff" * 11, b"fxgraph"])
    start, end = at + field[0], min(at + field[1], len(out))
    out[start:end] = value[: end - start].ljust(end - start, b"\0")
    if rng.random() < 0.7:  # usually fix the checksum, so the edit reaches the checks behind it
        out[at + 148 : at + 156] = b" " * 8
        out[at + 148 : at + 156] = b"%06o\0 " % sum(out[at : at + 512])
    return bytes(out)


def _replace_somewhere(rng: random.Random, doc: dict) -> None:
    node, key = doc, rng.choice(list(doc))
    while isinstance(node[key], (dict, list)) and node[key] and rng.random() < 0.6:
        node = node[key]
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
    node[key] = rng.choice(_HOSTILE_VALUES)


def _plant(root: Path, raw: bytes, blob: bytes, base: Manifest) -> str:
    """Write the entry where `base`'s key would be looked up, and the blob where its digest names it."""
    key_digest = Key.of(base.kind, base.key).digest
    entry = root / "index" / base.kind / f"{key_digest}.json"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(raw)
    try:
        digest = json.loads(raw)["blob"]["digest"].removeprefix("sha256:")
    except Exception:
        digest = base.blob.hex
    if isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        path = root / "blobs" / "sha256" / digest[:2] / f"{digest}.tar.zst"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    return key_digest
