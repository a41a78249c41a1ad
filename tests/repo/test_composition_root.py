"""The composition root is the only wiring: no command module builds a store, a registry, a trust
policy or a signer itself (engine/compose.py does, and hands them over)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# What only engine/compose.py may call: the constructors of the store, the registry, the trust
# policy and the signer.
WIRING = re.compile(
    r"\bStore\(|\bopen_registry\(|\btrust_in_force\(|\btrust_for\(|\bsigner_from_env\(|\bKeySigner\(|"
    r"\b[A-Z]\w*Registry\("  # any registry class: FileRegistry, S3Registry, ChainRegistry, LayoutRegistry...
)


def wiring_outside_the_root(folder: Path, root: Path = REPO) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if WIRING.search(code):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_command_builds_its_own_store_registry_trust_or_signer():
    found = wiring_outside_the_root(REPO / "engine" / "cli")
    assert not found, "wiring outside engine/compose.py (take it from the composition root):\n" + "\n".join(found)


def test_the_check_finds_a_command_that_opens_its_own_registry(tmp_path):
    (tmp_path / "cmd.py").write_text(
        "from prebake.registry import open_registry\n\ndef run(a):\n    return open_registry(a)  # wiring\n"
    )
    assert wiring_outside_the_root(tmp_path, tmp_path) == ["cmd.py:4: return open_registry(a)  # wiring"]
