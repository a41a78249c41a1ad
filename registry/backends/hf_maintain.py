"""What `prebake verify --quarantine` and `prebake promote --prune` need from a Hub registry
(prebake.artifacts.ports.registry.Maintainable).

    index/<kind>/<digest>.json         -> quarantine/index/<kind>/<digest>.json
    blobs/sha256/<aa>/<digest>.tar.zst -> quarantine/blobs/sha256/<aa>/<digest>.tar.zst

A Hub repo is git: a move is one commit that adds the copy and deletes the original, on top
of the head it read (a concurrent publish makes the commit fail, and verify reports it), and
the history keeps every byte. The index entry moves first, so readers miss from then on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prebake.artifacts.layout import blob_relpath, index_relpath, side_folder_relpath
from prebake.artifacts.ports.errors import RegistryError
from prebake.registry.backends.hf_parts import HubParts

QUARANTINE = "quarantine"


class HubMaintenance(HubParts):
    """Mixed into HubRegistry: raw index entries and quarantine, through its API client and fault mapping."""

    def index_entries(self) -> Iterator[tuple[str, bytes]]:
        """Every file under index/ at the head, as (path in the repo, raw bytes), unparsed."""
        head = self._head(create=False)
        if head is None:
            return
        for path in self._tree(head, "index"):
            if path.endswith(".json") and (local := self._download(path, head)) is not None:
                yield path, local.read_bytes()

    def quarantine(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> str:
        """Move an index entry (then, if given, its bad blob) under quarantine/; return the entry's new place."""
        head = self._head(create=False)
        moved = self._move_aside(index_relpath(kind, key_digest), head) if head else None
        if moved is None:
            raise RegistryError(f"cannot quarantine {kind} {key_digest[:16]}: its index entry in {self.url} is gone")
        if blob_digest is not None and (head := self._head(create=False)) is not None:
            self._move_aside(blob_relpath(blob_digest), head)  # a repo gone meanwhile has no blob to move
        return moved

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """Delete an index entry, then (if given) its blob and the files beside it, in one commit on the
        head it read (the history keeps the bytes; the head no longer names them)."""
        from huggingface_hub import CommitOperationDelete

        head = self._head(create=False)
        if head is None:
            return
        paths = [index_relpath(kind, key_digest)]
        if blob_digest is not None:
            paths += [blob_relpath(blob_digest), *self._tree(head, side_folder_relpath(blob_digest))]
        there = [p for p in paths if self._present(p, head)]
        if not there:
            return
        with self._faults(f"remove {self._where(there[0])}"):
            self._api.create_commit(
                self.repo_id,
                [CommitOperationDelete(path_in_repo=p) for p in there],
                commit_message=f"prebake promote --prune: remove {there[0]}",
                repo_type=self.repo_type,
                revision=self.revision,
                parent_commit=head,
            )

    def _tree(self, head: str, folder: str) -> list[str]:
        from huggingface_hub import RepoFile
        from huggingface_hub.errors import RemoteEntryNotFoundError

        with self._faults(f"list {self.url}/{folder}"):
            try:
                entries = self._api.list_repo_tree(
                    self.repo_id, path_in_repo=folder, recursive=True, repo_type=self.repo_type, revision=head
                )
                return sorted(e.path for e in entries if isinstance(e, RepoFile))
            except RemoteEntryNotFoundError:
                return []

    def _move_aside(self, relpath: str, head: str) -> str | None:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        local = self._download(relpath, head, force=True)
        if local is None:
            return None
        dest = f"{QUARANTINE}/{relpath}"
        if self._present(dest, head):  # quarantined before: keep both for whoever investigates
            dest = f"{dest}.{time.time_ns()}"
        operations: list[CommitOperationAdd | CommitOperationDelete] = [
            CommitOperationAdd(path_in_repo=dest, path_or_fileobj=str(local)),
            CommitOperationDelete(path_in_repo=relpath),
        ]
        with self._faults(f"quarantine {self._where(relpath)}"):
            self._api.create_commit(
                self.repo_id,
                operations,
                commit_message=f"prebake verify: quarantine {relpath}",
                repo_type=self.repo_type,
                revision=self.revision,
                parent_commit=head,
            )
        return str(self._where(dest))
