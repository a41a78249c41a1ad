"""One store actor, run by any release of prebake (its own venv's python, its own code): the role a
scenario gives it on a store that other processes, and other releases, use at the same time.

    python store_actor.py hold HOME REGISTRY MANIFEST   install it if needed, hold it, print "held <tree>",
                                                        keep holding until stdin closes
    python store_actor.py gc HOME                      gc the store down to 0 bytes, print the report
    python store_actor.py install HOME REGISTRY MANIFEST...   install each, print "installed <tree>"

It imports through every layout a release had (as tests/compat/make_fixtures.py does): the top-level
packages of 2026-11-30 or the one `prebake` package after it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _api():
    try:
        from prebake.artifacts.bundle.manifest import Manifest

        try:
            from prebake.artifacts.store.settings import StoreLimits
        except ImportError:  # before the store was cut by job
            from prebake.artifacts.store.local import StoreLimits  # type: ignore[no-redef,attr-defined]
        from prebake.artifacts.store.local import Store

        try:
            from prebake.registry.backends.file import FileRegistry
        except ImportError:
            from prebake.registry.file import FileRegistry  # type: ignore[no-redef]
    except ImportError:  # the top-level packages of 2026-11-30
        from artifacts.manifest import Manifest  # type: ignore[no-redef]
        from registry.file import FileRegistry  # type: ignore[no-redef]

        from artifacts.store import Store, StoreLimits  # type: ignore[no-redef]
    return Manifest, Store, StoreLimits, FileRegistry


def main(argv: list[str]) -> int:
    manifest_cls, store_cls, limits_cls, registry_cls = _api()
    role, home = argv[0], Path(argv[1])
    store = store_cls(home, limits_cls())
    if role == "gc":
        print(store.gc(0).render(), flush=True)
        return 0
    registry = registry_cls(Path(argv[2]))
    manifests = [manifest_cls.parse(Path(p).read_bytes(), p) for p in argv[3:]]
    if role == "install":
        for manifest in manifests:
            print(f"installed {store.install(manifest, registry).tree}", flush=True)
        return 0
    found = store.lookup(manifests[0].kind, manifests[0].key_digest) or store.install(manifests[0], registry)
    with store.use(found) as held:
        print(f"held {held.tree}", flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
