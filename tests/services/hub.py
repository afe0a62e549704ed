"""A local server that speaks the Hugging Face Hub's HTTP API, for huggingface_hub's own client.

It holds repositories with commits (a commit sha -> {path: bytes}) and refs (a branch, a tag or
``refs/convert/parquet`` -> a commit), and answers what ``HfFileSystem`` and `fs.hub` ask
(measured with huggingface_hub 2.4):

- ``GET /api/{kind}/{repo}[/revision/{rev}]``: the repository's info at a revision (``sha``);
- ``GET /api/{kind}/{repo}/tree/{rev}[/{path}]``: a listing (``recursive``), in pages linked by
  a ``Link: <...>; rel="next"`` header (`HubServer.page_size` entries a page);
- ``POST /api/{kind}/{repo}/paths-info/{rev}``: the entries of given paths;
- ``GET``/``HEAD /{kind}/{repo}/resolve/{rev}/{path}``: a file's bytes, with ``Range``
  (206 and ``Content-Range``), ``ETag`` and ``X-Repo-Commit``.

``kind`` is ``datasets`` (models have no prefix in resolve URLs, and are not served). A missing
repository, revision or file is a 404 with the Hub's ``X-Error-Code`` (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``), which huggingface_hub maps to its errors; a private
repository asked without a token, a 401 (``RepoNotFound``); a gated one, 401 ``GatedRepo``.

It counts requests by endpoint (`HubServer.counts`: ``info``, ``tree``, ``paths-info``,
``resolve``, ``resolve-head``), can move a branch to a new commit (`HubServer.push`), and
answer the next requests of an endpoint with a 429 and a ``Retry-After`` (`HubServer.inject`).
A `http.server.ThreadingHTTPServer` on loopback, in a thread of the test process: DataLoader
workers (fork or spawn) reach it by its URL, ``HF_ENDPOINT``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from .ports import HOST

__all__ = ["HubServer"]

_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass
class _Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    private: bool = False
    gated: bool = False


@dataclass
class _Fault:
    status: int
    count: int
    retry_after: str | None


class HubServer:
    """The Hub's HTTP API over in-memory repositories (see the module docstring).

    Args:
        page_size: entries per page of a tree listing.
        token: the token a private repository accepts (``Authorization: Bearer <token>``).
    """

    def __init__(self, *, page_size: int = 1000, token: str = "hf_test_token") -> None:
        self.page_size = page_size
        self.token = token
        self.repos: dict[str, _Repo] = {}
        self.counts: Counter[str] = Counter()
        self.faults: dict[str, _Fault] = {}
        self.faulted: Counter[str] = Counter()  # 429s (or other faults) answered, by endpoint
        self.lock = threading.Lock()
        self._serial = 0
        server = ThreadingHTTPServer((HOST, 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """The server's URL (``HF_ENDPOINT``)."""
        return f"http://{HOST}:{self._server.server_address[1]}"

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def create(
        self, repo: str, files: Mapping[str, bytes], *, private: bool = False, gated: bool = False
    ) -> str:
        """A dataset repository ``repo`` whose first commit (on ``main``) holds ``files``; its
        sha."""
        with self.lock:
            self.repos[repo] = _Repo(private=private, gated=gated)
        return self.push(repo, files)

    def push(self, repo: str, files: Mapping[str, bytes], *, branch: str = "main") -> str:
        """A new commit holding exactly ``files``, ``branch`` moved to it; its sha."""
        with self.lock:
            self._serial += 1
            digest = hashlib.sha1(f"{repo}:{self._serial}".encode())
            for path in sorted(files):
                digest.update(path.encode() + hashlib.sha256(files[path]).digest())
            sha = digest.hexdigest()
            self.repos[repo].commits[sha] = dict(files)
            self.repos[repo].refs[branch] = sha
        return sha

    def tag(self, repo: str, name: str, commit: str) -> None:
        """Point ref ``name`` (a tag, ``refs/convert/parquet``) at ``commit``."""
        with self.lock:
            self.repos[repo].refs[name] = commit

    def inject(
        self, endpoint: str, count: int, *, status: int = 429, retry_after: str | None = "0"
    ) -> None:
        """Answer the next ``count`` requests of ``endpoint`` with ``status`` (and a
        ``Retry-After`` header unless None)."""
        with self.lock:
            self.faults[endpoint] = _Fault(status, count, retry_after)

    def reset(self) -> None:
        """Forget the counts and pending faults."""
        with self.lock:
            self.counts.clear()
            self.faulted.clear()
            self.faults.clear()

    def _fault(self, endpoint: str) -> _Fault | None:
        with self.lock:
            self.counts[endpoint] += 1
            fault = self.faults.get(endpoint)
            if fault is None or fault.count <= 0:
                return None
            fault.count -= 1
            self.faulted[endpoint] += 1
            return fault


def _blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _entry(path: str, data: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": "file",
        "oid": _blob_oid(data),
        "size": len(data),
        "path": path,
    }
    if path.endswith(".parquet"):  # (stored in LFS, as the Hub stores binary files)
        entry["lfs"] = {
            "oid": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "pointerSize": 134,
        }
    return entry


def _tree(files: Mapping[str, bytes], base: str, recursive: bool) -> list[dict[str, Any]]:
    """The entries under ``base``: files, and directories (all of them when ``recursive``)."""
    prefix = f"{base}/" if base else ""
    entries: dict[str, dict[str, Any]] = {}
    for path, data in files.items():
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        for depth in range(1, len(parts)):
            if depth > 1 and not recursive:
                break
            folder = prefix + "/".join(parts[:depth])
            entries[folder] = {"type": "directory", "oid": "0" * 40, "size": 0, "path": folder}
        if recursive or len(parts) == 1:
            entries[path] = _entry(path, data)
    return [entries[p] for p in sorted(entries)]


class _Answer(Exception):
    """An error answer: status, X-Error-Code, message."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_GET(self) -> None:
            self._serve("GET")

        def do_HEAD(self) -> None:
            self._serve("HEAD")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            body = b""
            if method == "POST":
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            split = urlsplit(self.path)
            segments = [unquote(s) for s in split.path.strip("/").split("/")]
            query = parse_qs(split.query)
            endpoint = _endpoint_of(segments, method)
            try:
                if endpoint is None:
                    raise _Answer(404, None, f"no such endpoint: {method} {split.path}")
                fault = hub._fault(endpoint)
                if fault is not None:
                    headers = (
                        {} if fault.retry_after is None else {"Retry-After": fault.retry_after}
                    )
                    self._json(fault.status, {"error": "Too many requests"}, headers)
                    return
                self._route(endpoint, segments, query, method, body)
            except _Answer as answer:
                headers = {"X-Error-Message": answer.message}
                if answer.code is not None:
                    headers["X-Error-Code"] = answer.code
                self._json(answer.status, {"error": answer.message}, headers, method == "HEAD")

        def _route(
            self,
            endpoint: str,
            segments: list[str],
            query: dict[str, list[str]],
            method: str,
            body: bytes,
        ) -> None:
            api = endpoint != "resolve" and endpoint != "resolve-head"
            at = 2 if api else 1  # ("api", "datasets" | "datasets")
            repo_id = "/".join(segments[at : at + 2])
            repo = self._repo(repo_id)
            rest = segments[at + 2 :]
            if endpoint == "info":
                sha = self._commit(repo, rest[1] if rest else "main")
                siblings = [{"rfilename": p} for p in sorted(repo.commits[sha])]
                info = {"id": repo_id, "sha": sha, "private": repo.private, "siblings": siblings}
                self._json(200, info)
                return
            # (the revision is one segment, percent-encoded when it holds "/")
            sha = self._commit(repo, rest[1])
            files = repo.commits[sha]
            inner = "/".join(rest[2:])
            if endpoint == "tree":
                self._listing(files, inner, query, sha)
            elif endpoint == "paths-info":
                asked = parse_qs(body.decode()).get("paths", []) if body else []
                if body.startswith(b"{"):
                    asked = json.loads(body).get("paths", [])
                found = [_entry(p, files[p]) for p in asked if p in files]
                found += [
                    {"type": "directory", "oid": "0" * 40, "size": 0, "path": p}
                    for p in asked
                    if p not in files and any(f.startswith(p + "/") for f in files)
                ]
                self._json(200, found)
            else:
                self._file(files, inner, sha, method)

        def _repo(self, repo_id: str) -> _Repo:
            repo = hub.repos.get(repo_id)
            if repo is None:
                raise _Answer(404, "RepoNotFound", "Repository not found")
            granted = self.headers.get("Authorization") == f"Bearer {hub.token}"
            if (repo.private or repo.gated) and not granted:
                code = "GatedRepo" if repo.gated else "RepoNotFound"
                raise _Answer(401, code, "Access to this repository is restricted")
            return repo

        def _commit(self, repo: _Repo, revision: str) -> str:
            with hub.lock:
                if revision in repo.refs:
                    return repo.refs[revision]
                if _COMMIT.fullmatch(revision) and revision in repo.commits:
                    return revision
            raise _Answer(404, "RevisionNotFound", f"Invalid rev id: {revision}")

        def _listing(
            self, files: Mapping[str, bytes], inner: str, query: dict[str, list[str]], sha: str
        ) -> None:
            if inner in files:
                raise _Answer(400, None, f"{inner} is a file, not a directory")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            entries = _tree(files, inner, recursive)
            if inner and not entries:
                raise _Answer(404, "EntryNotFound", f"{inner} does not exist on {sha}")
            cursor = int(query.get("cursor", ["0"])[0])
            page = entries[cursor : cursor + hub.page_size]
            headers = {}
            if cursor + hub.page_size < len(entries):
                split = urlsplit(self.path)
                params = f"recursive={str(recursive).lower()}&expand=false"
                link = f"{hub.endpoint}{split.path}?{params}&cursor={cursor + hub.page_size}"
                headers["Link"] = f'<{link}>; rel="next"'
            self._json(200, page, headers)

        def _file(self, files: Mapping[str, bytes], inner: str, sha: str, method: str) -> None:
            data = files.get(inner)
            if data is None:
                raise _Answer(404, "EntryNotFound", f"{inner} does not exist on {sha}")
            entry = _entry(inner, data)
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            headers = {"ETag": f'"{etag}"', "X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
            status, part = 200, data
            asked = self.headers.get("Range")
            if asked:
                start, stop = _range(asked, len(data))
                status, part = 206, data[start:stop]
                headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
            self._send(status, part, "application/octet-stream", headers, method == "HEAD")

        def _json(
            self,
            status: int,
            value: Any,
            headers: Mapping[str, str] | None = None,
            head: bool = False,
        ) -> None:
            self._send(status, json.dumps(value).encode(), "application/json", headers or {}, head)

        def _send(
            self, status: int, body: bytes, kind: str, headers: Mapping[str, str], head: bool
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return Handler


def _endpoint_of(segments: list[str], method: str) -> str | None:
    """Which endpoint a request's path segments name (None: none served)."""
    if segments[:1] == ["api"] and len(segments) >= 4 and segments[1] == "datasets":
        rest = segments[4:]
        if not rest and method == "GET":
            return "info"
        if rest[:1] == ["revision"] and len(rest) == 2 and method == "GET":
            return "info"
        if rest[:1] == ["tree"] and len(rest) >= 2 and method == "GET":
            return "tree"
        if rest[:1] == ["paths-info"] and len(rest) == 2 and method == "POST":
            return "paths-info"
        return None
    if segments[:1] == ["datasets"] and len(segments) >= 6 and segments[3] == "resolve":
        return "resolve" if method == "GET" else "resolve-head"
    return None


def _range(header: str, size: int) -> tuple[int, int]:
    """``[start, stop)`` of a ``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` header."""
    first, _, last = header.removeprefix("bytes=").partition("-")
    if not first:
        return max(0, size - int(last)), size
    start = int(first)
    stop = min(size, int(last) + 1) if last else size
    if start >= size:
        raise _Answer(416, None, f"range {header} outside {size} bytes")
    return start, stop


def quoted_revision(revision: str) -> str:
    """``revision`` as an hf:// path writes it (``refs%2Fconvert%2Fparquet``)."""
    return quote(revision, safe="")
