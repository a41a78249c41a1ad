"""Make the compatibility fixtures under tests/compat/fixtures/<release>/ with an OLDER prebake.

Run it with the older commit's code, from a worktree of that commit (the fixtures are committed as
data; this script is kept so they can be made again, or for a new release):

    git worktree add /tmp/old <commit>
    cd /tmp/old && PYTHONPATH=/tmp/old <this repo>/.venv/bin/python <this repo>/tests/compat/make_fixtures.py \\
        <this repo>/tests/compat/fixtures/<release>

Each fixture folder holds what that release wrote, nothing else:

    registry/     a folder registry with one small signed bundle (graphs kind, a toy key)
    store/        a PREBAKE_HOME that installed it (index entry, blob, tree, lease, lock, ...)
    signer.pub    the public line of the fixture key (its private half is derived from a fixed seed:
                  a test key, trusting it means nothing)
    made-by.json  the commit and what the release's formats were

The script imports through either layout: the top-level packages of releases before 2026-12-01
(artifacts, registry) or the one `prebake` package after.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SEED = hashlib.sha256(b"prebake compatibility fixtures").digest()
SIGNER = "compat-fixture"


def main(out: Path) -> None:
    if Path("prebake").is_dir():  # one package (2026-12-01 on)
        from prebake.artifacts.store.local import Store, StoreLimits
        from prebake.registry.trust.signing import KeySigner, PublicKey

        if Path("registry/backends/file.py").is_file():  # the registry port (2026-12-01, later)
            from prebake.registry.backends.file import FileRegistry
        else:
            from prebake.registry.file import FileRegistry  # type: ignore[no-redef]
    else:  # top-level packages (releases of 2026-11-30)
        from registry.file import FileRegistry  # type: ignore[no-redef]
        from registry.signing import KeySigner, PublicKey  # type: ignore[no-redef]

        from artifacts.store import Store, StoreLimits  # type: ignore[no-redef]
    from tests.support.bundles import make_bundle

    if out.exists():
        shutil.rmtree(out)
    work = out.parent / f".{out.name}-work"
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    signer = KeySigner(SIGNER, key)
    bundle = make_bundle(work, model="compat-model", payload_bytes=2048)
    manifest = signer(bundle.manifest)
    registry = FileRegistry(out / "registry")
    registry.publish(manifest, bundle.blob)
    store = Store(out / "store", StoreLimits())
    installed = store.install(manifest, registry)
    shutil.rmtree(work)
    from cryptography.hazmat.primitives import serialization

    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    import base64

    public = f"{SIGNER}:{base64.b64encode(raw).decode()}"
    PublicKey.parse(public, "fixture key")
    (out / "signer.pub").write_text(public + "\n")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    signed = json.loads(manifest.to_bytes())["signatures"][0]
    made = {
        "commit": commit,
        "kind": manifest.kind,
        "key_digest": manifest.key_digest,
        "blob": manifest.blob.digest,
        "signature_version": signed.get("version", 1),
        "tree": str(installed.tree.relative_to(out / "store")),
    }
    (out / "made-by.json").write_text(json.dumps(made, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, ".")
    main(Path(sys.argv[1]).resolve())
