"""A small in-memory stand-in for the Hugging Face Hub: a real HTTP server on loopback, for tests.

It speaks the part of the Hub's HTTP API that huggingface_hub calls to create a repo, read
its head, commit files, and download or list them:

    POST     /api/repos/create                                        create a model or dataset repo
    GET      /api/{models|datasets}/<ns>/<name>[/revision/<rev>]      repo info: head commit sha
    POST     /api/{models|datasets}/<ns>/<name>/preupload/<rev>       upload mode of each file
    POST     /api/{models|datasets}/<ns>/<name>/commit/<rev>          NDJSON commit: header + file lines
    GET      /api/{models|datasets}/<ns>/<name>/tree/<rev>[/<path>]   listing (?recursive=true)
    GET|HEAD /[datasets/]<ns>/<name>/resolve/<rev>/<path>             bytes, ETag, X-Repo-Commit

With lfs=True (tests/support/hub_lfs.py), preupload answers "lfs" as the Hub does (paths the
repo's .gitattributes sends to LFS, files of 10 MB and more), the LFS batch API takes basic
uploads, commits name such files by oid and downloads carry X-Linked-Etag/-Size. Without it,
preupload answers "regular" for every file and content arrives base64 in the commit.

Where it differs from the Hub: no Xet storage (clients need HF_HUB_DISABLE_XET); nothing is
authorised (the Authorization header is recorded, so tests can see a token arrive);
revisions are branches or commit shas (no tags, no pull requests). Like the Hub, a commit
whose parentCommit is no longer its branch's head is refused (412), and errors carry the
X-Error-Code header (RepoNotFound, RevisionNotFound, EntryNotFound) huggingface_hub reads.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support import hub_lfs

_API = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)(?:/(revision|preupload|commit|tree)/([^/]+)(/.*)?)?$")
_RESOLVE = re.compile(r"^/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_SHA = re.compile(r"^[0-9a-f]{40}$")


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes: what the Hub uses as ETag and oid of regular files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubRepo:
    repo_type: str  # "model" | "dataset"
    repo_id: str
    heads: dict[str, str] = field(default_factory=dict)  # branch -> commit sha
    trees: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit sha -> path -> bytes
    commits: list[str] = field(default_factory=list)  # oldest first


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None, **extra):
        super().__init__(message)
        self.status, self.code, self.commit, self.extra = status, code, commit, extra


class HubStandIn:
    """The server and its state; `url` is what HF_ENDPOINT should be set to."""

    def __init__(self, *, lfs: bool = False) -> None:
        self.repos: dict[tuple[str, str], HubRepo] = {}
        self.authorizations: list[str | None] = []
        # Called as on_commit(repo_type, repo_id) before each API commit is applied: lets a test
        # land someone else's commit in the window between a client reading the head and committing.
        self.on_commit: Callable[[str, str], None] | None = None
        self.stale_commits_refused = 0
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"hub": self}))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.lfs = hub_lfs.LfsStore(self.url) if lfs else None
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-stand-in", daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def repo_url(self, repo_type: str, repo_id: str) -> str:
        return f"{self.url}/{'' if repo_type == 'model' else repo_type + 's/'}{repo_id}"

    # -- what tests look at or break ----------------------------------------------------------

    def files(self, repo_type: str, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            return dict(repo.trees[self._resolve(repo, revision)])

    def commit_shas(self, repo_type: str, repo_id: str) -> list[str]:
        with self._lock:
            return list(self._repo(repo_type, repo_id).commits)

    def push(self, repo_type: str, repo_id: str, files: dict[str, bytes], branch: str = "main") -> str:
        """Commit files directly, as another client would; return the new head."""
        with self._lock:
            return self._add_commit(self._repo(repo_type, repo_id), branch, dict(files))

    def overwrite(self, repo_type: str, repo_id: str, path: str, data: bytes) -> None:
        """Replace a stored file's bytes in every commit that holds it, as storage rot would."""
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            for tree in repo.trees.values():
                if path in tree:
                    tree[path] = data

    # -- the Hub's operations -------------------------------------------------------------------

    def create_repo(self, repo_type: str, repo_id: str) -> None:
        with self._lock:
            if (repo_type, repo_id) in self.repos:
                raise HttpError(
                    409, f"You already created this {repo_type} repo", url=self.repo_url(repo_type, repo_id)
                )
            repo = HubRepo(repo_type, repo_id)
            self.repos[(repo_type, repo_id)] = repo
            self._add_commit(repo, "main", {".gitattributes": b"*.zst filter=lfs diff=lfs merge=lfs -text\n"})

    def info(self, repo_type: str, repo_id: str, revision: str) -> dict:
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            sha = self._resolve(repo, revision)
            return {
                "id": repo_id,
                "sha": sha,
                "private": True,
                "siblings": [{"rfilename": p} for p in sorted(repo.trees[sha])],
            }

    def preupload(self, repo_type: str, repo_id: str, revision: str, files: list[dict]) -> dict:
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            tree = repo.trees[self._resolve(repo, revision)]
            answer = [
                {
                    "path": f["path"],
                    "uploadMode": self.lfs.upload_mode(f["path"], f.get("size", 0), tree.get(".gitattributes", b""))
                    if self.lfs
                    else "regular",
                    "shouldIgnore": False,
                    "oid": git_blob_id(tree[f["path"]]) if f["path"] in tree else None,
                }
                for f in files
            ]
            return {"files": answer}

    def commit(self, repo_type: str, repo_id: str, branch: str, lines: list[dict]) -> str:
        header = next((line["value"] for line in lines if line["key"] == "header"), {})
        changes: dict[str, bytes | None] = {}
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                changes[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                changes[value["path"]] = None
            elif key == "lfsFile" and self.lfs is not None:
                data = self.lfs.get(value["oid"])
                if data is None:
                    raise HttpError(400, f"LFS object {value['oid']} of {value['path']} was never uploaded")
                changes[value["path"]] = data
            elif key != "header":
                raise HttpError(400, f"this stand-in takes regular files and deletions only, not {key!r}")
        if self.on_commit is not None:
            self.on_commit(repo_type, repo_id)
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            if branch not in repo.heads:
                raise HttpError(404, f"branch {branch} not found", "RevisionNotFound")
            parent = header.get("parentCommit")
            if parent and not repo.heads[branch].startswith(parent):
                self.stale_commits_refused += 1
                raise HttpError(412, "A commit has happened since. Please refresh and try again.")
            return self._add_commit(repo, branch, changes)

    def tree(self, repo_type: str, repo_id: str, revision: str, path: str, recursive: bool) -> list[dict]:
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            sha = self._resolve(repo, revision)
            files = repo.trees[sha]
        base = path.strip("/") + "/" if path.strip("/") else ""
        entries: dict[str, dict] = {}
        for name, data in sorted(files.items()):
            if not name.startswith(base):
                continue
            parts = name[len(base) :].split("/")
            depth = len(parts) if recursive else 1
            for i in range(1, min(depth, len(parts) - 1) + 1):
                folder = base + "/".join(parts[:i])
                entries[folder] = {"type": "directory", "path": folder, "oid": "0" * 40, "size": 0}
            if recursive or len(parts) == 1:
                entries[name] = {"type": "file", "path": name, "oid": git_blob_id(data), "size": len(data)}
        if base and not entries:
            raise HttpError(404, f"{path} does not exist at {revision}", "EntryNotFound", commit=sha)
        return [entries[k] for k in sorted(entries)]

    def resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> tuple[bytes, str]:
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            sha = self._resolve(repo, revision)
            if path not in repo.trees[sha]:
                raise HttpError(404, f"{path} does not exist at {revision}", "EntryNotFound", commit=sha)
            return repo.trees[sha][path], sha

    # -- state, under the lock --------------------------------------------------------------------

    def _repo(self, repo_type: str, repo_id: str) -> HubRepo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HttpError(404, f"{repo_type} repo {repo_id} not found", "RepoNotFound")
        return repo

    @staticmethod
    def _resolve(repo: HubRepo, revision: str) -> str:
        if revision in repo.heads:
            return repo.heads[revision]
        if _SHA.match(revision) and revision in repo.trees:
            return revision
        raise HttpError(404, f"revision {revision} not found", "RevisionNotFound")

    def _add_commit(self, repo: HubRepo, branch: str, changes: dict[str, bytes | None]) -> str:
        parent = repo.heads.get(branch)
        tree = dict(repo.trees[parent]) if parent else {}
        for path, data in changes.items():
            if data is None:
                tree.pop(path, None)
            else:
                tree[path] = data
        seed = f"{parent}:{next(self._counter)}:" + ",".join(f"{p}={git_blob_id(d)}" for p, d in sorted(tree.items()))
        sha = hashlib.sha1(seed.encode()).hexdigest()
        repo.trees[sha], repo.heads[branch] = tree, sha
        repo.commits.append(sha)
        return sha


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_POST(self) -> None:
        self._serve(head=False)

    def do_PUT(self) -> None:
        self._serve(head=False)

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _serve(self, head: bool) -> None:
        self.hub.authorizations.append(self.headers.get("Authorization"))
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if self.command in ("POST", "PUT") else b""
        try:
            if self.command == "POST" and url.path == "/api/repos/create":
                self._create(json.loads(body))
            elif m := _API.match(url.path):
                self._api(m, query, body)
            elif (m := _RESOLVE.match(url.path)) and self.command in ("GET", "HEAD"):
                self._resolve(m, head)
            elif self.hub.lfs is not None and (hub_lfs.BATCH.match(url.path) or hub_lfs.OBJECT.match(url.path)):
                self._lfs(url.path, body)
            else:
                raise HttpError(404, f"no route for {self.command} {url.path}")
        except HttpError as exc:
            headers = {"X-Error-Message": str(exc)}
            if exc.code:
                headers["X-Error-Code"] = exc.code
            if exc.commit:
                headers["X-Repo-Commit"] = exc.commit
            self._send(exc.status, json.dumps({"error": str(exc), **exc.extra}).encode(), headers, head)

    def _create(self, payload: dict) -> None:
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        self.hub.create_repo(repo_type, repo_id)
        self._json({"url": self.hub.repo_url(repo_type, repo_id), "name": repo_id, "id": repo_id})

    def _api(self, m: re.Match, query: dict[str, str], body: bytes) -> None:
        repo_type, repo_id = m.group(1)[:-1], m.group(2)
        action, revision, rest = m.group(3), unquote(m.group(4) or "main"), unquote(m.group(5) or "")
        if action in (None, "revision") and self.command == "GET":
            self._json(self.hub.info(repo_type, repo_id, revision))
        elif action == "preupload" and self.command == "POST":
            self._json(self.hub.preupload(repo_type, repo_id, revision, json.loads(body)["files"]))
        elif action == "commit" and self.command == "POST":
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            sha = self.hub.commit(repo_type, repo_id, revision, lines)
            self._json(
                {
                    "commitUrl": f"{self.hub.repo_url(repo_type, repo_id)}/commit/{sha}",
                    "commitOid": sha,
                    "success": True,
                }
            )
        elif action == "tree" and self.command == "GET":
            recursive = query.get("recursive", "").lower() in ("1", "true")
            self._json(self.hub.tree(repo_type, repo_id, revision, rest, recursive))
        else:
            raise HttpError(404, f"no route for {self.command} {self.path}")

    def _resolve(self, m: re.Match, head: bool) -> None:
        repo_type = "dataset" if m.group(1) else "model"
        data, sha = self.hub.resolve(repo_type, m.group(2), unquote(m.group(3)), unquote(m.group(4)))
        headers = {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": sha, "Content-Type": "application/octet-stream"}
        if self.hub.lfs is not None:
            headers.update(self.hub.lfs.linked_headers(data, download=not head))
        status, start = 200, 0
        if (rng := re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))) and int(rng.group(1)) <= len(data):
            status, start = 206, int(rng.group(1))
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._send(status, data[start:], headers, head)

    def _lfs(self, path: str, body: bytes) -> None:
        lfs = self.hub.lfs
        if hub_lfs.BATCH.match(path) and self.command == "POST":
            self._json(lfs.batch(json.loads(body)))
        elif (m := hub_lfs.OBJECT.match(path)) and self.command == "PUT" and not m.group(2):
            if not lfs.put(m.group(1), body):
                raise HttpError(400, f"the uploaded bytes do not hash to {m.group(1)}")
            self._send(200, b"", {}, head=False)
        elif m and self.command == "POST" and m.group(2):
            if not lfs.verify(m.group(1), json.loads(body)["size"]):
                raise HttpError(404, f"LFS object {m.group(1)} is not stored whole")
            self._json({"success": True})
        else:
            raise HttpError(404, f"no route for {self.command} {path}")

    def _json(self, value: object) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"}, head=False)

    def _send(self, status: int, data: bytes, headers: dict[str, str], head: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)


@contextmanager
def hub_server(*, lfs: bool = False) -> Iterator[HubStandIn]:
    """A running stand-in on a free loopback port, shut down on exit (with the LFS batch API if lfs)."""
    with HubStandIn(lfs=lfs) as hub:
        yield hub
