"""What the volume under a store allows: writing at all (a read-only mount), room for scratch, and
locks that hold across the machines that mount it (a network filesystem's flock may not).

    writable(home)          False on a read-only mount or a folder this process may not write
    filesystem(home)        the type of the filesystem holding `home`, from /proc/self/mountinfo
    shared_kind(fstype)     "network" for NFS, CIFS/SMB, Ceph, Lustre, GlusterFS, 9p, FUSE; else "local"
    shared_refusal(home)    why a writer refuses a store on a network filesystem, or None
    warn_once(home, what)   one warning line per store and subject, however often a write fails

docs/operations.md, "Volumes", says which filesystems the store supports and why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("prebake.store")

SHARED_ENV = "PREBAKE_SHARED_STORE"  # "flock": the operator vouches that flock holds across the volume's nodes
SCRATCH_MIN_FREE = 1 << 30  # a scratch folder (a compile in place) goes elsewhere below this much free space
NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "glusterfs", "9p", "afs", "gpfs", "beegfs"}
)
_warned: set[tuple[Path, str]] = set()


def writable(home: Path) -> bool:
    """Whether this process can write in the store `home` (or, if it does not exist yet, create it)."""
    folder = _existing(home)
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    return not read_only and os.access(folder, os.W_OK | os.X_OK)


def roomy(home: Path, need: int = SCRATCH_MIN_FREE) -> bool:
    """Whether the disk of `home` (or of the folder it will be made in) has `need` bytes free."""
    try:
        found = os.statvfs(_existing(home))
    except OSError:
        return False
    return found.f_bavail * found.f_frsize >= need


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def filesystem(home: Path, mountinfo: str | None = None) -> str:
    """The filesystem type of the deepest mount holding `home` ("unknown" if /proc says nothing)."""
    try:
        text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    except OSError:
        return "unknown"
    path, best, fstype = os.path.realpath(home), "", "unknown"
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        kind = line.split(" - ", 1)[1].split()[0]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, kind
    return fstype


def shared_kind(fstype: str) -> str:
    """ "network" for a filesystem many machines mount (flock may be local to each), else "local"."""
    base = fstype.split(".", 1)[0]
    return "network" if base in NETWORK_FILESYSTEMS or base.startswith("fuse") else "local"


def shared_refusal(home: Path, env: Mapping[str, str] = os.environ, mountinfo: str | None = None) -> str | None:
    """Why a writer (install, gc, evict, recover) refuses the store `home`, or None. On a network
    filesystem flock may be local to each node (NFS mounted nolock, most FUSE filesystems), so two
    nodes could each evict what the other serves: refused, unless PREBAKE_SHARED_STORE=flock says the
    volume's locks hold across its nodes (NFSv4 with its lock manager, CephFS)."""
    fstype = filesystem(home, mountinfo)
    if shared_kind(fstype) != "network" or env.get(SHARED_ENV, "").lower() == "flock":
        return None
    return (
        f"the store {home} is on {fstype}, a network filesystem whose locks may not hold across the machines "
        f"that mount it, so a gc on one node could evict a tree another node serves; nothing was written. "
        f"Fill it from one writer and serve it read-only elsewhere, keep the store on local disk, or set "
        f"{SHARED_ENV}=flock if this volume's flock holds across its nodes (NFSv4 with its lock manager, CephFS)"
    )


def warn_once(home: Path, what: str, line: str) -> None:
    if (home, what) not in _warned:
        _warned.add((home, what))
        log.warning("%s", line)
