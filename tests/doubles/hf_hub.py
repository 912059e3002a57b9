#!/usr/bin/env python3
"""A test double of the Hugging Face Hub's HTTP API, for model downloads. It is not the Hub.

It serves, from a directory of plain files, the requests that the real `huggingface_hub` client (2.4.0)
makes to download a model repo, so that `snapshot_download`, `hf_hub_download`, `HfApi().model_info` and
`HfApi().list_repo_files` / `list_repo_tree` work against it with `HF_ENDPOINT=http://127.0.0.1:PORT`.
Standard library only:

    python3 tests/doubles/hf_hub.py --root DIR --host 127.0.0.1 --port N [--token TOKEN] [--port-file F]
        [--tree-page-size N] [--log-requests]
    python3 tests/doubles/hf_hub.py publish --root DIR --repo org/name [--ref main] SRC_DIR   # prints the sha
    python3 tests/doubles/hf_hub.py gate --root DIR --repo org/name --mode manual [--grant TOKEN ...]

`--port 0` picks a free port; `--port-file F` gets the port once the socket is bound.

Storage: `DIR/<org>/<name>/<40-hex commit sha>/...files...`, one directory per commit, and
`DIR/<org>/<name>/refs.json` (`{"main": "<sha>"}`, optional) for branch names. `publish()` (or the
`publish` command) copies a directory in as a commit whose sha is a sha1 over the sorted relative paths
and the file bytes (the same content gives the same sha), and points the ref at it. Commits are
immutable: the double caches their file hashes. `DIR/<org>/<name>/settings.json` (written by
`set_gated()` / `gate`) makes a repo gated.

Routes, as the client 2.4.0 calls them (references are to huggingface_hub/ in that release):
- `GET /api/models/{repo_id}` and `GET /api/models/{repo_id}/revision/{revision}` (hf_api.py,
  `HfApi.model_info`; `repo_info` and `snapshot_download` call it to resolve a branch to a commit):
  JSON with `id`, `modelId`, `author`, `sha`, `private`, `gated`, `disabled`, `lastModified`,
  `createdAt`, `tags`, `downloads`, `likes`, `siblings: [{"rfilename"}]` (with `?blobs=true` also `size`,
  `blobId` and `lfs: {size, sha256, pointerSize}`, the fields `ModelInfo.__init__` reads). The revision
  comes URL-quoted with `safe=""`, so `refs/pr/1` is one path segment.
- `GET /api/models/{repo_id}/tree/{revision}[/{path}]?recursive=..&expand=..` (hf_api.py,
  `HfApi._iter_repo_tree_pages`; `snapshot_download` lists the tree of the commit, `list_repo_files` too):
  a JSON list of `{"type": "file", "oid", "size", "path"[, "lfs": {"oid", "size", "pointerSize"}]}` and
  `{"type": "directory", "oid", "size": 0, "path"}` (`RepoFile` / `RepoFolder`), paginated by a
  `Link: <...&cursor=N>; rel="next"` header (utils/_pagination.py, `_paginate_pages`) at 1000 entries
  per page, the Hub's cap that `_iter_repo_tree_pages` documents (`--tree-page-size` to test paging).
  A path that names a file lists that one entry (not checked against the Hub).
- `HEAD` and `GET /{repo_id}/resolve/{revision}/{path}` (file_download.py, `hf_hub_url`,
  `get_hf_file_metadata`, `http_get`): `X-Repo-Commit` (the commit the revision resolved to; the client
  refuses a response without it), `ETag` quoted (`_normalize_etag` strips `W/` and quotes), and
  `Content-Length` (the size the HEAD reports is the size `http_get` checks the body against). A regular
  file's ETag is its git blob sha1; an LFS file (most suffixes of the Hub's default `.gitattributes`,
  or 10 MiB and more) has `ETag`, `X-Linked-Etag` = sha256 of the bytes and `X-Linked-Size`, which
  `get_hf_file_metadata` prefers, and which `_hf_hub_download_to_local_dir` compares against the sha256
  of a local file whose download metadata is missing or older than the file. `Range: bytes=a-b | a- |
  -n` answers 206 with `Content-Range` (`http_get` sends `Range` to resume a broken download, and reads
  the size from `Content-Range`); an unsatisfiable range answers 416 with `Content-Range: bytes */SIZE`.

Errors, as the real Hub gives them and as utils/_http.py `hf_raise_for_status` maps them (it reads the
`X-Error-Code` header first, then the status; `X-Error-Message` and the JSON body's `error` go into the
exception's message, `_format`):
- unknown repo: `X-Error-Code: RepoNotFound` -> `RepositoryNotFoundError`; status 401 for an anonymous
  request and 404 for an authenticated one (the Hub answers 401 to an anonymous request for a repo it
  will not show, so that a private repo and a missing one look the same; the client comments on it
  beside the `RepoNotFound` branch). Without the header a 401 becomes `RepositoryNotFoundError` only for
  `https://` URLs (`REPO_API_REGEX`), so the double always sends it.
- unknown revision: 404 `X-Error-Code: RevisionNotFound` -> `RevisionNotFoundError` (`snapshot_download`
  re-raises it at once; a 40-hex revision skips `model_info` and fails on the tree listing).
- missing file or tree path: 404 `X-Error-Code: EntryNotFound` with `X-Repo-Commit`
  -> `RemoteEntryNotFoundError` (file_download.py `_get_metadata_or_catch_error` caches the absence
  under `.no_exist/<commit>` from that header).
- `--token TOKEN`: every repo is private. No `Authorization` header -> 401 `RepoNotFound` with
  `X-Error-Message: Invalid username or password.` -> `RepositoryNotFoundError`. A wrong bearer token ->
  401 with `X-Error-Message: Invalid credentials in Authorization header` and no error code, which
  `hf_raise_for_status` deliberately keeps out of `RepositoryNotFoundError`: it is a plain
  `HfHubHTTPError` with status 401, which `snapshot_download` and `_raise_on_head_call_error` re-raise
  as is. Without `--token` any bearer token is accepted.
- gated repo (`set_gated`): metadata and tree stay readable, `/resolve` answers `X-Error-Code:
  GatedRepo` -> `GatedRepoError`, 401 when anonymous and 403 for a token not in the repo's granted list.

Test hooks (not part of the Hub): `GET /_double/stats` -> JSON counters: `downloads` (file GETs per
`org/name/path`), `downloads_total`, `bytes_sent`, `requests` (per route), `requests_total` (every
Hub request, errors included); `POST /_double/reset` zeroes them. `--log-requests` prints each request.

Not modelled: datasets, spaces and single-segment repo ids (`gpt2`); uploads, commits and every write
API; tags and `refs` listing; short commit ids; `expand=true` fields (`lastCommit`, security scans);
the redirect of LFS files to a CDN host (the Hub answers 302 with the metadata on that response and
`_httpx2_follow_hub_redirects_with_backoff` stops there; the double serves the bytes with 200 from the
same URL); Xet storage (no `X-Xet-Hash`, so the client downloads over plain HTTP even with hf_xet
installed); gzip content encoding; rate limits (429) and outages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
# Patterns of the .gitattributes the Hub puts in a new model repo (files stored with git LFS), plus the
# Hub's size limit for a regular git file.
LFS_SUFFIXES = (
    ".7z", ".arrow", ".bin", ".bz2", ".ckpt", ".ftz", ".gz", ".h5", ".joblib", ".mlmodel", ".model",
    ".msgpack", ".npy", ".npz", ".onnx", ".ot", ".parquet", ".pb", ".pickle", ".pkl", ".pt", ".pth",
    ".rar", ".safetensors", ".tar", ".tflite", ".tgz", ".wasm", ".xz", ".zip", ".zst",
)  # fmt: skip
LFS_SIZE = 10 * 1024 * 1024
CHUNK = 1024 * 1024
DEFAULT_TREE_PAGE = 1000


# ---------------------------------------------------------------------------------------------- storage


def _split_repo_id(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(REPO_PART.fullmatch(p) for p in parts) or ".." in repo_id:
        raise ValueError(f"repo id must be 'org/name' (letters, digits, '.', '_', '-'): {repo_id!r}")
    return parts[0], parts[1]


def _repo_dir(root: Path, repo_id: str) -> Path:
    org, name = _split_repo_id(repo_id)
    return Path(root) / org / name


def _write_json_atomic(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def _source_files(src_dir: Path) -> list[tuple[str, Path]]:
    files = []
    for p in sorted(src_dir.rglob("*")):
        rel = p.relative_to(src_dir)
        if ".git" in rel.parts or not p.is_file():
            continue
        files.append((rel.as_posix(), p))
    return sorted(files)


def commit_sha(src_dir: Path) -> str:
    """The sha `publish` gives `src_dir`: sha1 over the sorted relative paths, sizes and bytes."""
    h = hashlib.sha1()
    for rel, p in _source_files(Path(src_dir)):
        data = p.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def publish(root: Path, repo_id: str, src_dir: Path, ref: str = "main") -> str:
    """Copy the files under `src_dir` into `root` as a commit of `repo_id`, point `ref` at it, return its sha.

    Deterministic: the same files give the same sha (publishing them again only moves the ref). `.git`
    directories are skipped; an empty `src_dir` is an error.
    """
    root, src_dir = Path(root), Path(src_dir)
    repo = _repo_dir(root, repo_id)
    if COMMIT_SHA.fullmatch(ref) or not ref or ref.startswith("/") or ".." in ref.split("/"):
        raise ValueError(f"bad ref name: {ref!r}")
    files = _source_files(src_dir)
    if not files:
        raise ValueError(f"nothing to publish under {src_dir}")
    sha = commit_sha(src_dir)
    dest = repo / sha
    if not dest.is_dir():
        repo.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=repo, prefix=f".{sha}.", suffix=".tmp"))
        try:
            for rel, p in files:
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(p, target)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    refs = _read_json(repo / "refs.json")
    refs[ref] = sha
    _write_json_atomic(repo / "refs.json", refs)
    return sha


def set_gated(root: Path, repo_id: str, mode: str | bool = "manual", granted: tuple[str, ...] = ()) -> None:
    """Make `repo_id` gated (`mode` "manual" or "auto"; False un-gates it); `granted` tokens may download."""
    if mode not in (False, "manual", "auto"):
        raise ValueError(f"gated mode must be 'manual', 'auto' or False: {mode!r}")
    repo = _repo_dir(Path(root), repo_id)
    settings = _read_json(repo / "settings.json")
    settings["gated"] = mode
    settings["granted"] = sorted(set(granted))
    _write_json_atomic(repo / "settings.json", settings)


@dataclass(frozen=True)
class Blob:
    path: str
    size: int
    git_oid: str  # sha1 of the git blob (for an LFS file: of its pointer file)
    sha256: str | None  # LFS files only
    pointer_size: int | None  # LFS files only

    @property
    def etag(self) -> str:
        return self.sha256 or self.git_oid


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _is_lfs(path: str, size: int) -> bool:
    return size >= LFS_SIZE or path.lower().endswith(LFS_SUFFIXES)


def _hash_file(path: Path, rel: str) -> Blob:
    size = path.stat().st_size
    if not _is_lfs(rel, size):
        return Blob(rel, size, _git_blob_sha1(path.read_bytes()), None, None)
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    sha256 = h.hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    return Blob(rel, size, _git_blob_sha1(pointer), sha256, len(pointer))


class Store:
    """Read side of the storage layout; file hashes are cached per (repo, commit), commits being immutable."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._trees: dict[tuple[str, str], dict[str, Blob]] = {}

    def repo_dir(self, repo_id: str) -> Path | None:
        try:
            d = _repo_dir(self.root, repo_id)
        except ValueError:
            return None
        return d if d.is_dir() else None

    def settings(self, repo_id: str) -> dict:
        d = self.repo_dir(repo_id)
        return _read_json(d / "settings.json") if d else {}

    def resolve(self, repo_id: str, revision: str) -> str | None:
        d = self.repo_dir(repo_id)
        if d is None:
            return None
        if COMMIT_SHA.fullmatch(revision):
            return revision if (d / revision).is_dir() else None
        sha = _read_json(d / "refs.json").get(revision)
        return sha if isinstance(sha, str) and (d / sha).is_dir() else None

    def files(self, repo_id: str, sha: str) -> dict[str, Blob]:
        key = (repo_id, sha)
        with self._lock:
            cached = self._trees.get(key)
        if cached is not None:
            return cached
        base = _repo_dir(self.root, repo_id) / sha
        tree = {}
        for p in sorted(base.rglob("*")):
            if p.is_file():
                rel = p.relative_to(base).as_posix()
                tree[rel] = _hash_file(p, rel)
        with self._lock:
            self._trees[key] = tree
        return tree

    def file_path(self, repo_id: str, sha: str, rel: str) -> Path:
        return _repo_dir(self.root, repo_id) / sha / rel

    def commit_time(self, repo_id: str, sha: str) -> str:
        mtime = (_repo_dir(self.root, repo_id) / sha).stat().st_mtime
        return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


# ---------------------------------------------------------------------------------------------- server


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.downloads: dict[str, int] = {}
        self.requests: dict[str, int] = {}
        self.bytes_sent = 0

    def request(self, route: str) -> None:
        with self.lock:
            self.requests[route] = self.requests.get(route, 0) + 1

    def download(self, key: str, nbytes: int) -> None:
        with self.lock:
            self.downloads[key] = self.downloads.get(key, 0) + 1
            self.bytes_sent += nbytes

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "downloads": dict(sorted(self.downloads.items())),
                "downloads_total": sum(self.downloads.values()),
                "bytes_sent": self.bytes_sent,
                "requests": dict(sorted(self.requests.items())),
                "requests_total": sum(self.requests.values()),
            }


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], store: Store, token: str | None, tree_page: int, log: bool):
        super().__init__(addr, Handler)
        self.store, self.token, self.tree_page, self.log = store, token, tree_page, log
        self.stats = Stats()


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) for a single `bytes=` range; None = serve the whole file; raises on 416."""
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if m is None:
        return None  # multiple ranges or another unit: a server may ignore Range (RFC 9110 14.2)
    first, last = m.groups()
    if first == "" and last == "":
        return None
    if first == "":
        n = int(last)
        if n == 0 or size == 0:
            raise HubError(416, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
        return max(0, size - n), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        raise HubError(416, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, end


class Handler(BaseHTTPRequestHandler):
    server: HubServer
    protocol_version = "HTTP/1.1"
    server_version = "hf-hub-double/1"

    # ------------------------------------------------------------------ plumbing

    def log_message(self, format: str, *args: object) -> None:
        if self.server.log:
            sys.stderr.write(f"hf_hub double: {format % args}\n")

    def _send(self, status: int, body: bytes, headers: dict[str, str], content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self._send(status, body, headers or {}, "application/json; charset=utf-8")

    def _error(self, e: HubError) -> None:
        headers = {"X-Error-Message": e.message}
        if e.code:
            headers["X-Error-Code"] = e.code
        headers.update(e.headers)
        self._json(e.status, {"error": e.message}, headers)

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        raw = url.path.split("/")[1:]
        segs = [unquote(s) for s in raw]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if self.command == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
        if segs[:1] == ["_double"]:
            self._double(segs[1:])
            return
        try:
            self._route(segs, query)
        except HubError as e:
            self.server.stats.request("error")
            self._error(e)

    def _double(self, segs: list[str]) -> None:
        if segs == ["stats"] and self.command == "GET":
            self._json(200, self.server.stats.snapshot())
        elif segs == ["reset"] and self.command == "POST":
            with self.server.stats.lock:
                self.server.stats.reset()
            self._json(200, {"ok": True})
        else:
            self._json(404, {"error": "Not Found"})

    # ------------------------------------------------------------------ Hub semantics

    def _auth(self) -> str | None:
        """The request's bearer token, None when anonymous; raises the Hub's 401 for a wrong token."""
        header = self.headers.get("Authorization")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise HubError(401, "Invalid credentials in Authorization header")
        if self.server.token is not None and token != self.server.token:
            raise HubError(401, "Invalid credentials in Authorization header")
        return token

    def _repo(self, repo_id: str, token: str | None) -> None:
        """Raise RepoNotFound as the Hub does for a missing repo or one the caller may not see."""
        missing = self.server.store.repo_dir(repo_id) is None
        if self.server.token is not None and token is None:
            raise HubError(401, "Invalid username or password.", "RepoNotFound")
        if missing:
            raise HubError(401 if token is None else 404, "Repository not found", "RepoNotFound")

    def _revision(self, repo_id: str, revision: str) -> str:
        sha = self.server.store.resolve(repo_id, revision)
        if sha is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return sha

    def _route(self, segs: list[str], query: dict[str, str]) -> None:
        if self.command == "POST":
            raise HubError(405, "Method Not Allowed")
        if segs[:2] == ["api", "models"] and len(segs) >= 4:
            if self.command != "GET":
                raise HubError(405, "Method Not Allowed")
            repo_id = f"{segs[2]}/{segs[3]}"
            rest = segs[4:]
            token = self._auth()
            if not rest or (rest[0] == "revision" and len(rest) == 2):
                self.server.stats.request("model_info")
                self._repo(repo_id, token)
                self._model_info(repo_id, rest[1] if rest else "main", query)
                return
            if rest[0] == "tree" and len(rest) >= 2:
                self.server.stats.request("tree")
                self._repo(repo_id, token)
                self._tree(repo_id, rest[1], "/".join(rest[2:]), query)
                return
        elif len(segs) >= 5 and segs[2] == "resolve":
            repo_id = f"{segs[0]}/{segs[1]}"
            self.server.stats.request(f"resolve_{self.command.lower()}")
            token = self._auth()
            self._repo(repo_id, token)
            self._resolve(repo_id, segs[3], "/".join(segs[4:]), token)
            return
        raise HubError(404, "Not Found")

    def _model_info(self, repo_id: str, revision: str, query: dict[str, str]) -> None:
        store = self.server.store
        sha = self._revision(repo_id, revision)
        files = store.files(repo_id, sha)
        blobs = query.get("blobs", "").lower() in ("1", "true")
        siblings = []
        for blob in files.values():
            sib: dict = {"rfilename": blob.path}
            if blobs:
                sib.update(size=blob.size, blobId=blob.git_oid)
                if blob.sha256:
                    sib["lfs"] = {"size": blob.size, "sha256": blob.sha256, "pointerSize": blob.pointer_size}
            siblings.append(sib)
        org = repo_id.split("/")[0]
        when = store.commit_time(repo_id, sha)
        self._json(
            200,
            {
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": org,
                "sha": sha,
                "lastModified": when,
                "createdAt": when,
                "private": self.server.token is not None,
                "gated": store.settings(repo_id).get("gated", False),
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
                "spaces": [],
                "usedStorage": sum(b.size for b in files.values()),
            },
        )

    def _tree(self, repo_id: str, revision: str, path: str, query: dict[str, str]) -> None:
        sha = self._revision(repo_id, revision)
        files = self.server.store.files(repo_id, sha)
        path = path.strip("/")
        recursive = query.get("recursive", "").lower() in ("1", "true")
        prefix = f"{path}/" if path else ""
        if path and path not in files and not any(p.startswith(prefix) for p in files):
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": sha})
        if path in files:
            entries = [self._file_entry(files[path])]
        else:
            dirs: set[str] = set()
            selected: list[Blob] = []
            for p, blob in files.items():
                if not p.startswith(prefix):
                    continue
                rel_parts = p[len(prefix) :].split("/")
                for i in range(1, len(rel_parts)):
                    if recursive or i == 1:
                        dirs.add(prefix + "/".join(rel_parts[:i]))
                if recursive or len(rel_parts) == 1:
                    selected.append(blob)
            entries = [
                {"type": "directory", "oid": _tree_oid(files, d), "size": 0, "path": d} for d in sorted(dirs)
            ] + [self._file_entry(b) for b in sorted(selected, key=lambda b: b.path)]
        page = self.server.tree_page
        try:
            start = max(0, int(query.get("cursor", "0")))
        except ValueError:
            raise HubError(400, "Invalid cursor") from None
        headers = {}
        if start + page < len(entries):
            params = {k: v for k, v in query.items() if k != "cursor"}
            params["cursor"] = str(start + page)
            qs = "&".join(f"{quote(k)}={quote(v)}" for k, v in params.items())
            path_only = self.path.split("?", 1)[0]
            headers["Link"] = f'<{self._base()}{path_only}?{qs}>; rel="next"'
        self._json(200, entries[start : start + page], headers)

    @staticmethod
    def _file_entry(blob: Blob) -> dict:
        entry: dict = {"type": "file", "oid": blob.git_oid, "size": blob.size, "path": blob.path}
        if blob.sha256:
            entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
        return entry

    def _resolve(self, repo_id: str, revision: str, path: str, token: str | None) -> None:
        store = self.server.store
        settings = store.settings(repo_id)
        if settings.get("gated"):
            if token is None:
                raise HubError(
                    401,
                    f"Access to model {repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in.",
                    "GatedRepo",
                )
            if token not in settings.get("granted", []):
                raise HubError(
                    403,
                    f"Access to model {repo_id} is restricted and you are not in the authorized list. "
                    f"Visit {self._base()}/{repo_id} to ask for access.",
                    "GatedRepo",
                )
        sha = self._revision(repo_id, revision)
        blob = store.files(repo_id, sha).get(path)
        if blob is None:
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": sha})
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{blob.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}; "
            f'filename="{path.rsplit("/", 1)[-1]}";',
        }
        if blob.sha256:
            headers["X-Linked-Etag"] = f'"{blob.sha256}"'
            headers["X-Linked-Size"] = str(blob.size)
        status, start, end = 200, 0, blob.size - 1
        rng = self.headers.get("Range")
        if rng:
            span = _parse_range(rng, blob.size)
            if span is not None:
                status, (start, end) = 206, span
                headers["Content-Range"] = f"bytes {start}-{end}/{blob.size}"
        length = max(0, end - start + 1)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        self.server.stats.download(f"{repo_id}/{path}", length)
        with store.file_path(repo_id, sha, path).open("rb") as f:
            f.seek(start)
            left = length
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)

    def _base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{self.headers.get('Host') or f'{host}:{port}'}"


def _tree_oid(files: dict[str, Blob], directory: str) -> str:
    h = hashlib.sha1()
    for p, blob in files.items():
        if p.startswith(directory + "/"):
            h.update(f"{p}\0{blob.git_oid}\0".encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- CLI


def serve(root: Path, host: str, port: int, token: str | None = None, port_file: Path | None = None,
          tree_page: int = DEFAULT_TREE_PAGE, log: bool = False) -> None:  # fmt: skip
    server = HubServer((host, port), Store(root), token, tree_page, log)
    bound = server.server_address[1]
    if port_file is not None:
        port_file = Path(port_file)
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(f"{bound}\n")
        os.replace(tmp, port_file)
    print(f"hf_hub double serving {root} on http://{host}:{bound}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["publish"]:
        p = argparse.ArgumentParser(prog="hf_hub.py publish", description="Publish a directory as a commit")
        p.add_argument("--root", type=Path, required=True)
        p.add_argument("--repo", required=True, help="org/name")
        p.add_argument("--ref", default="main")
        p.add_argument("src", type=Path)
        a = p.parse_args(argv[1:])
        print(publish(a.root, a.repo, a.src, a.ref))
        return 0
    if argv[:1] == ["gate"]:
        p = argparse.ArgumentParser(prog="hf_hub.py gate", description="Make a repo gated (or not)")
        p.add_argument("--root", type=Path, required=True)
        p.add_argument("--repo", required=True, help="org/name")
        p.add_argument("--mode", choices=["manual", "auto", "off"], default="manual")
        p.add_argument("--grant", action="append", default=[], help="token allowed to download (repeat)")
        a = p.parse_args(argv[1:])
        set_gated(a.root, a.repo, False if a.mode == "off" else a.mode, tuple(a.grant))
        return 0
    p = argparse.ArgumentParser(description="Test double of the Hugging Face Hub HTTP API (downloads)")
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (repos are private)")
    p.add_argument("--port-file", type=Path, default=None)
    p.add_argument("--tree-page-size", type=int, default=DEFAULT_TREE_PAGE)
    p.add_argument("--log-requests", action="store_true")
    a = p.parse_args(argv)
    if a.tree_page_size < 1:
        p.error("--tree-page-size must be at least 1")
    a.root.mkdir(parents=True, exist_ok=True)
    serve(a.root, a.host, a.port, a.token, a.port_file, a.tree_page_size, a.log_requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
