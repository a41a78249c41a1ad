"""The machine's set of vector-ISA probes (runtime.isa_probes): published whole, seeded only when every
file verifies, a set that does not verify replaced; torch's real probes: tests/integration/test_isa_probes.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prebake.engine.bundled.runtime import isa_probes

FILES = {Path("ab/cabc.cpp"): b"int probe();\n", Path("ab/cabc.so"): b"\x7fELF library"}


def _cache(root: Path) -> Path:
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_a_published_set_lists_every_file_the_probe_made_with_its_digest(tmp_path):
    cache, target = _cache(tmp_path / "cache"), tmp_path / "sets" / "key"
    assert isa_probes._publish(target, cache, sorted(FILES)) == "compiled and published for the machine"
    manifest = json.loads((target / isa_probes.MANIFEST).read_text())["files"]
    assert manifest == {str(name): hashlib.sha256(data).hexdigest() for name, data in FILES.items()}
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_a_verified_set_seeds_a_private_cache_folder_with_its_files(tmp_path):
    target = tmp_path / "sets" / "key"
    isa_probes._publish(target, _cache(tmp_path / "cache"), sorted(FILES))
    private = tmp_path / "private"
    assert isa_probes._seed(target, private)
    assert {name: (private / name).read_bytes() for name in FILES} == FILES
    assert isa_probes._probe_files(private) == set(FILES)


def test_a_set_with_one_changed_byte_seeds_nothing_and_the_next_probe_replaces_it(tmp_path):
    target, cache = tmp_path / "sets" / "key", _cache(tmp_path / "cache")
    isa_probes._publish(target, cache, sorted(FILES))
    library = target / "ab" / "cabc.so"
    library.write_bytes(library.read_bytes()[:-1] + b"X")  # a torn or rotted library
    private = tmp_path / "private"
    assert not isa_probes._seed(target, private)
    assert not private.exists() or not any(private.rglob("*"))
    said = isa_probes._publish(target, cache, sorted(FILES))
    assert said.endswith("(its set there did not verify: replaced)")
    assert isa_probes._seed(target, tmp_path / "private2")


def test_a_set_missing_its_manifest_or_naming_paths_outside_it_seeds_nothing(tmp_path):
    target = tmp_path / "sets" / "key"
    target.mkdir(parents=True)
    assert not isa_probes._seed(target, tmp_path / "private")  # no manifest: a set half-written by hand
    outside = tmp_path / "outside.so"
    outside.write_bytes(b"x")
    digest = hashlib.sha256(b"x").hexdigest()
    (target / isa_probes.MANIFEST).write_text(json.dumps({"files": {"../../outside.so": digest}}))
    assert not isa_probes._seed(target, tmp_path / "private")
    assert not (tmp_path / "private").exists()


def test_a_set_another_process_published_first_is_kept(tmp_path):
    target, cache = tmp_path / "sets" / "key", _cache(tmp_path / "cache")
    isa_probes._publish(target, cache, sorted(FILES))
    first = (target / isa_probes.MANIFEST).stat().st_ino
    # the race: this process found no set, compiled, and publishes after the winner
    said = isa_probes._publish(target, cache, sorted(FILES))
    assert said == "compiled (another process published the machine's set first)"
    assert (target / isa_probes.MANIFEST).stat().st_ino == first
    assert isa_probes._seed(target, tmp_path / "private")


def test_a_probe_that_compiled_nothing_publishes_nothing(tmp_path):
    target = tmp_path / "sets" / "key"
    assert isa_probes._publish(target, tmp_path, []) == "found in the cache folder"
    assert not target.exists()


def test_an_unwritable_machine_folder_is_said_and_the_probe_stands(tmp_path):
    blocker = tmp_path / "sets"
    blocker.write_text("a file where the sets' folder should be")
    said = isa_probes._publish(blocker / "key", _cache(tmp_path / "cache"), sorted(FILES))
    assert said.startswith("compiled, not published:") and str(blocker) in said


def test_a_cache_folder_that_cannot_take_the_set_is_left_to_torch(tmp_path):
    target = tmp_path / "sets" / "key"
    isa_probes._publish(target, _cache(tmp_path / "cache"), sorted(FILES))
    blocked = tmp_path / "private"
    blocked.write_text("a file where the cache folder should be")
    assert not isa_probes._seed(target, blocked)
