"""The Git LFS side of the Hub stand-in: the batch API with basic transfers, as the Hub speaks it.

    POST /[datasets/]<ns>/<name>.git/info/lfs/objects/batch   which objects to upload, and where
    PUT  /lfs-objects/<sha256>                                  the object's bytes (basic transfer)
    POST /lfs-objects/<sha256>/verify                           the upload is whole

An object is kept only if its bytes hash to its oid. A commit names it by oid ("lfsFile"
lines), and a download of a file whose bytes are a stored object carries the Hub's
X-Linked-Etag / X-Linked-Size headers. No Xet: clients must run with HF_HUB_DISABLE_XET.
"""

from __future__ import annotations

import hashlib
import re
import threading
from fnmatch import fnmatch

BATCH = re.compile(r"^/(?:datasets/)?[^/]+/[^/]+\.git/info/lfs/objects/batch$")
OBJECT = re.compile(r"^/lfs-objects/([0-9a-f]{64})(/verify)?$")
HUB_LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub stores files of 10 MB and more through LFS


class LfsStore:
    def __init__(self, base_url: str, threshold: int = HUB_LFS_THRESHOLD):
        self.base_url, self.threshold = base_url, threshold
        self.objects: dict[str, bytes] = {}
        self.uploads = 0
        self.downloads = 0
        self._lock = threading.Lock()

    def upload_mode(self, path: str, size: int, gitattributes: bytes) -> str:
        """'lfs' for a path the repo's .gitattributes sends to LFS or a file at the threshold or above."""
        patterns = [line.split()[0] for line in gitattributes.decode().splitlines() if "filter=lfs" in line]
        return (
            "lfs" if size >= self.threshold or any(fnmatch(path.rsplit("/", 1)[-1], p) for p in patterns) else "regular"
        )

    def batch(self, request: dict) -> dict:
        if request.get("operation") != "upload" or "basic" not in request.get("transfers", ["basic"]):
            return {"message": "this stand-in takes basic uploads only"}
        answer = []
        for obj in request["objects"]:
            oid, size = obj["oid"], obj["size"]
            entry = {"oid": oid, "size": size}
            with self._lock:
                present = oid in self.objects
            if not present:  # no actions: the Hub already has the object
                href = f"{self.base_url}/lfs-objects/{oid}"
                entry["actions"] = {"upload": {"href": href}, "verify": {"href": f"{href}/verify"}}
            answer.append(entry)
        return {"transfer": "basic", "objects": answer}

    def put(self, oid: str, data: bytes) -> bool:
        if hashlib.sha256(data).hexdigest() != oid:
            return False
        with self._lock:
            self.objects[oid] = data
            self.uploads += 1
        return True

    def verify(self, oid: str, size: int) -> bool:
        with self._lock:
            return oid in self.objects and len(self.objects[oid]) == size

    def get(self, oid: str) -> bytes | None:
        with self._lock:
            return self.objects.get(oid)

    def linked_headers(self, data: bytes, *, download: bool) -> dict[str, str]:
        """The X-Linked-* headers of an answer whose bytes are an LFS object (else none)."""
        oid = hashlib.sha256(data).hexdigest()
        with self._lock:
            if oid not in self.objects:
                return {}
            self.downloads += download
        return {"X-Linked-Etag": f'"{oid}"', "X-Linked-Size": str(len(data))}
