"""The Hugging Face Hub double (tests/doubles/hf_hub.py) against the real `huggingface_hub` client.

The double runs as a subprocess on a free loopback port. The client runs in its own subprocess too, with
`HF_ENDPOINT` in its environment: huggingface_hub reads it once at import (`constants.ENDPOINT`, and
`constants.HUGGINGFACE_CO_URL_TEMPLATE` that `hf_hub_url` builds file URLs from), so patching
`constants.ENDPOINT` after the import would leave the /resolve URLs pointing at huggingface.co.

Besides the double, these tests pin down what the client (2.4.0) does with `local_dir`, which a model
fetch relies on: a re-fetch at a commit sha makes no request at all, and a damaged file is re-downloaded
only when its mtime is newer than the download's metadata, never by content alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

DOUBLE = Path(__file__).resolve().parent / "doubles" / "hf_hub.py"
REPO = "tiny-org/tiny-model"
OTHER_SHA = "0123456789abcdef0123456789abcdef01234567"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"

pytest.importorskip("huggingface_hub")


def _load_double():
    spec = importlib.util.spec_from_file_location("hf_hub_double", DOUBLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up while the class is created
    spec.loader.exec_module(mod)
    return mod


hub_double = _load_double()

# Runs in the client subprocess: each op is {"fn": ..., "kwargs": {...}}; prints one JSON result per op.
CLIENT = r"""
import json, sys
from huggingface_hub import HfApi, hf_hub_download, snapshot_download

def run(fn, kwargs):
    if fn == "snapshot_download":
        return snapshot_download(**kwargs)
    if fn == "hf_hub_download":
        return hf_hub_download(**kwargs)
    if fn == "model_info":
        info = HfApi().model_info(**kwargs)
        return {"id": info.id, "sha": info.sha, "private": info.private, "gated": info.gated,
                "siblings": sorted(s.rfilename for s in info.siblings),
                "lfs": sorted(s.rfilename for s in info.siblings if s.lfs)}
    if fn == "list_repo_files":
        return sorted(HfApi().list_repo_files(**kwargs))
    raise ValueError(fn)

out = []
for op in json.loads(sys.argv[1]):
    try:
        out.append({"ok": run(op["fn"], op["kwargs"])})
    except Exception as e:
        response = getattr(e, "response", None)
        out.append({"error": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
                    "status": getattr(response, "status_code", None), "message": str(e)})
print(json.dumps(out))
"""


class Hub:
    """The double as a subprocess, plus a way to run the real client against it."""

    def __init__(self, root: Path, work: Path, *args: str) -> None:
        self.root, self.work = root, work
        work.mkdir(parents=True, exist_ok=True)
        port_file = work / "port"
        self.log = (work / "double.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(DOUBLE),
                "--root",
                str(root),
                "--port",
                "0",
                "--port-file",
                str(port_file),
                *args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"double did not start: {(work / 'double.log').read_text()}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"
        self.hf_home = work / "hf_home"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/_double/stats", timeout=10) as r:
            return json.loads(r.read())

    def client(self, *ops: tuple[str, dict]) -> list[dict]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
        env.update(
            HF_ENDPOINT=self.url,
            HF_HUB_OFFLINE="0",
            HF_HOME=str(self.hf_home),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
            NO_PROXY="*",
        )
        payload = json.dumps([{"fn": fn, "kwargs": kwargs} for fn, kwargs in ops])
        proc = subprocess.run(
            [sys.executable, "-c", CLIENT, payload], env=env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def one(self, fn: str, **kwargs: object) -> dict:
        return self.client((fn, kwargs))[0]


@pytest.fixture
def start_hub(tmp_path: Path) -> Iterator:
    hubs: list[Hub] = []

    def start(*args: str) -> Hub:
        hub = Hub(tmp_path / "hub_root", tmp_path / f"hub{len(hubs)}", *args)
        hubs.append(hub)
        return hub

    yield start
    for hub in hubs:
        hub.stop()


def _safetensors(n: int, seed: int) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + random.Random(seed).randbytes(4 * n)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "tokenizer").mkdir(parents=True)
    (src / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 8}) + "\n")
    index = {"metadata": {"total_size": 8 * 4096}, "weight_map": {"a.w": SHARD1, "b.w": SHARD2}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index) + "\n")
    (src / SHARD1).write_bytes(_safetensors(4096, 1))
    (src / SHARD2).write_bytes(_safetensors(4096, 2))
    (src / "tokenizer" / "tokenizer.json").write_text(json.dumps({"vocab": {"a": 0, "b": 1}}) + "\n")
    return src


def _tree(d: Path) -> dict[str, bytes]:
    """The files under d (relative posix path -> bytes), without the client's `.cache/huggingface`."""
    return {
        p.relative_to(d).as_posix(): p.read_bytes()
        for p in d.rglob("*")
        if p.is_file() and p.relative_to(d).parts[:1] != (".cache",)
    }


def snap(revision: str | None, local: Path | None = None, **kwargs: object) -> tuple[str, dict]:
    """A snapshot_download op for `Hub.client` (repo_id defaults to REPO)."""
    kwargs.setdefault("repo_id", REPO)
    if revision is not None:
        kwargs["revision"] = revision
    if local is not None:
        kwargs["local_dir"] = str(local)
    return "snapshot_download", kwargs


def _ok(result: dict) -> object:
    assert "ok" in result, result
    return result["ok"]


# ------------------------------------------------------------------------------------------ publish


def test_publish_is_deterministic_and_moves_the_ref(tmp_path: Path, model_dir: Path) -> None:
    root = tmp_path / "root"
    sha = hub_double.publish(root, REPO, model_dir)
    assert len(sha) == 40 and sha == hub_double.commit_sha(model_dir)
    assert hub_double.publish(root, REPO, model_dir) == sha
    assert json.loads((root / REPO / "refs.json").read_text()) == {"main": sha}
    assert _tree(root / REPO / sha) == _tree(model_dir)

    (model_dir / "config.json").write_text("{}\n")
    cli = subprocess.run(
        [sys.executable, str(DOUBLE), "publish", "--root", str(root), "--repo", REPO, str(model_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    sha2 = cli.stdout.strip()
    assert len(sha2) == 40 and sha2 != sha
    assert json.loads((root / REPO / "refs.json").read_text()) == {"main": sha2}
    assert (root / REPO / sha).is_dir(), "the old commit stays downloadable"
    with pytest.raises(ValueError):
        hub_double.publish(root, "no-slash", model_dir)
    with pytest.raises(ValueError):
        hub_double.publish(root, "../escape", model_dir)


# ------------------------------------------------------------------------------------------ downloads


def test_snapshot_at_sha_and_at_main_is_byte_identical(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub()
    sha = hub_double.publish(hub.root, REPO, model_dir)
    at_sha, at_main = tmp_path / "at_sha", tmp_path / "at_main"
    info, files, by_sha, by_main = hub.client(
        ("model_info", {"repo_id": REPO, "files_metadata": True}),
        ("list_repo_files", {"repo_id": REPO, "revision": sha}),
        snap(sha, at_sha),
        snap("main", at_main),
    )
    expected = sorted(_tree(model_dir))
    assert _ok(info) == {
        "id": REPO,
        "sha": sha,
        "private": False,
        "gated": False,
        "siblings": expected,
        "lfs": [SHARD1, SHARD2],
    }
    assert _ok(files) == expected
    assert _ok(by_sha) == str(at_sha.resolve())
    assert _ok(by_main) == str(at_main.resolve())
    assert _tree(at_sha) == _tree(model_dir)
    assert _tree(at_main) == _tree(model_dir)
    # The client keeps its bookkeeping inside local_dir: the tree listing of the commit and, per file,
    # "commit\netag\ntimestamp".
    meta = at_sha / ".cache" / "huggingface"
    assert (meta / "trees" / f"{sha}.json").is_file()
    commit, etag, _ = (meta / "download" / f"{SHARD1}.metadata").read_text().splitlines()
    assert commit == sha
    assert etag == hub_double.Store(hub.root).files(REPO, sha)[SHARD1].sha256
    stats = hub.stats()
    assert stats["downloads"] == {f"{REPO}/{p}": 2 for p in expected}


def test_second_snapshot_downloads_nothing(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub()
    sha = hub_double.publish(hub.root, REPO, model_dir)
    local = tmp_path / "model"
    _ok(hub.one("snapshot_download", repo_id=REPO, revision=sha, local_dir=str(local)))
    first = hub.stats()
    assert first["downloads_total"] == 5

    _ok(hub.one("snapshot_download", repo_id=REPO, revision=sha, local_dir=str(local)))
    again = hub.stats()
    # At a commit sha the client reads the tree from local_dir/.cache/huggingface/trees/ and each file's
    # metadata: not one request reaches the Hub.
    assert again == first

    _ok(hub.one("snapshot_download", repo_id=REPO, revision="main", local_dir=str(local)))
    at_main = hub.stats()
    # A branch costs one model_info call to resolve it, and nothing else.
    assert at_main["downloads"] == first["downloads"]
    assert at_main["requests_total"] == first["requests_total"] + 1
    assert at_main["requests"]["model_info"] == first["requests"].get("model_info", 0) + 1
    assert _tree(local) == _tree(model_dir)


def test_hf_hub_download_and_missing_file(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub()
    sha = hub_double.publish(hub.root, REPO, model_dir)
    got, missing = hub.client(
        ("hf_hub_download", {"repo_id": REPO, "filename": "tokenizer/tokenizer.json", "revision": sha}),
        ("hf_hub_download", {"repo_id": REPO, "filename": "nope.json", "revision": sha}),
    )
    path = Path(_ok(got))
    assert path.read_bytes() == (model_dir / "tokenizer" / "tokenizer.json").read_bytes()
    assert str(path).startswith(str(hub.hf_home))
    assert missing["error"] == "RemoteEntryNotFoundError" and missing["status"] == 404
    assert "EntryNotFoundError" in missing["mro"]


def test_unknown_revision_and_unknown_repo(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub()
    hub_double.publish(hub.root, REPO, model_dir)
    results = hub.client(
        snap(OTHER_SHA, tmp_path / "a"),
        snap("no-such-branch", tmp_path / "b"),
        ("hf_hub_download", {"repo_id": REPO, "filename": "config.json", "revision": OTHER_SHA}),
        snap(None, tmp_path / "c", repo_id="tiny-org/absent"),
        snap(OTHER_SHA, repo_id="tiny-org/absent"),
        ("model_info", {"repo_id": "tiny-org/absent"}),
    )
    for r in results[:3]:
        assert r["error"] == "RevisionNotFoundError" and r["status"] == 404, r
    for r in results[3:]:
        assert r["error"] == "RepositoryNotFoundError" and r["status"] == 401, r
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())


def test_token_required(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub("--token", "hf_right")
    sha = hub_double.publish(hub.root, REPO, model_dir)
    local = tmp_path / "model"
    none, wrong, wrong_info, right, info = hub.client(
        snap(sha, local),
        snap(sha, local, token="hf_bad"),
        ("model_info", {"repo_id": REPO, "token": "hf_bad"}),
        snap(sha, local, token="hf_right"),
        ("model_info", {"repo_id": REPO, "token": "hf_right"}),
    )
    # No token: the Hub hides a private repo behind 401 RepoNotFound.
    assert none["error"] == "RepositoryNotFoundError" and none["status"] == 401
    # A wrong token: 401 "Invalid credentials", which the client leaves a plain HfHubHTTPError.
    for r in (wrong, wrong_info):
        assert r["error"] == "HfHubHTTPError" and r["status"] == 401, r
        assert "Invalid credentials in Authorization header" in r["message"]
    assert _ok(right) == str(local.resolve())
    assert _tree(local) == _tree(model_dir)
    assert _ok(info)["private"] is True

    # Once local_dir holds the commit, a fetch at the sha never asks the Hub, so no token is checked;
    # at a branch the failed model_info falls back to the local copy (a warning, not an error).
    before = hub.stats()
    again_sha, again_main = hub.client(
        snap(sha, local),
        snap("main", local, token="hf_bad"),
    )
    assert _ok(again_sha) == _ok(again_main) == str(local.resolve())
    after = hub.stats()
    assert after["downloads_total"] == before["downloads_total"]
    assert after["requests_total"] == before["requests_total"] + 1  # the refused model_info


def test_gated_repo(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub()
    sha = hub_double.publish(hub.root, REPO, model_dir)
    hub_double.set_gated(hub.root, REPO, "manual", granted=("hf_granted",))
    anon, other, granted, info = hub.client(
        snap(sha, tmp_path / "a"),
        snap(sha, tmp_path / "b", token="x"),
        snap(sha, tmp_path / "c", token="hf_granted"),
        ("model_info", {"repo_id": REPO}),
    )
    assert anon["error"] == "GatedRepoError" and anon["status"] == 401
    assert other["error"] == "GatedRepoError" and other["status"] == 403
    assert _ok(granted) and _tree(tmp_path / "c") == _tree(model_dir)
    assert _ok(info)["gated"] == "manual"


# ------------------------------------------------------------------------------------------ damage


def _metadata_time(local: Path, name: str) -> float:
    return float((local / ".cache" / "huggingface" / "download" / f"{name}.metadata").read_text().split()[2])


def test_damaged_file_with_old_mtime_is_not_detected(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub()
    sha = hub_double.publish(hub.root, REPO, model_dir)
    local = tmp_path / "model"
    _ok(hub.one("snapshot_download", repo_id=REPO, revision=sha, local_dir=str(local)))
    shard = local / SHARD1
    stamp = _metadata_time(local, SHARD1)
    damaged = bytearray(shard.read_bytes())
    damaged[-1] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    os.utime(shard, (stamp, stamp))
    before = hub.stats()
    _ok(hub.one("snapshot_download", repo_id=REPO, revision=sha, local_dir=str(local)))
    # The client trusts local_dir's metadata (same commit, file not newer than the metadata): the
    # damage stays, and the Hub is not asked.
    assert shard.read_bytes() == bytes(damaged)
    assert hub.stats() == before


def test_newer_mtime_makes_the_client_check(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub()
    sha = hub_double.publish(hub.root, REPO, model_dir)
    local = tmp_path / "model"
    _ok(hub.one("snapshot_download", repo_id=REPO, revision=sha, local_dir=str(local)))
    later = time.time() + 60
    damaged = local / SHARD1
    damaged.write_bytes(b"\0" * damaged.stat().st_size)
    touched_lfs, touched_git = local / SHARD2, local / "config.json"
    for p in (damaged, touched_lfs, touched_git):
        os.utime(p, (later, later))
    before = hub.stats()
    _ok(hub.one("snapshot_download", repo_id=REPO, revision=sha, local_dir=str(local)))
    after = hub.stats()
    assert _tree(local) == _tree(model_dir)
    new = {k: v - before["downloads"].get(k, 0) for k, v in after["downloads"].items()}
    # Damaged LFS file: its sha256 differs from the ETag -> downloaded again. Intact LFS file with a new
    # mtime: hashed, matches, kept. A regular (git) file with a new mtime: downloaded again, intact or not.
    assert {k: v for k, v in new.items() if v} == {f"{REPO}/{SHARD1}": 1, f"{REPO}/config.json": 1}
    assert after["requests"]["resolve_head"] == before["requests"]["resolve_head"] + 3


# ------------------------------------------------------------------------------------------ HTTP details


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_resolve_headers_ranges_and_tree_paging(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub("--tree-page-size", "2")
    sha = hub_double.publish(hub.root, REPO, model_dir)
    data = (model_dir / SHARD1).read_bytes()
    url = f"{hub.url}/{REPO}/resolve/main/{SHARD1}"

    status, headers, body = _get(url)
    assert status == 200 and body == data
    assert headers["X-Repo-Commit"] == sha
    assert headers["X-Linked-Size"] == str(len(data))
    assert headers["ETag"] == headers["X-Linked-Etag"] == f'"{hub_double.hashlib.sha256(data).hexdigest()}"'

    status, headers, body = _get(url, {"Range": "bytes=100-"})
    assert status == 206 and body == data[100:]
    assert headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"
    status, _, body = _get(url, {"Range": "bytes=10-19"})
    assert status == 206 and body == data[10:20]
    status, headers, _ = _get(url, {"Range": f"bytes={len(data)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"

    status, headers, _ = _get(f"{hub.url}/{REPO}/resolve/{sha}/config.json")
    git_blob = hub_double._git_blob_sha1((model_dir / "config.json").read_bytes())
    assert headers["ETag"] == f'"{git_blob}"' and "X-Linked-Etag" not in headers

    status, headers, _ = _get(f"{hub.url}/{REPO}/resolve/{sha}/absent.bin")
    assert status == 404 and headers["X-Error-Code"] == "EntryNotFound" and headers["X-Repo-Commit"] == sha

    # 5 files + 1 directory over pages of 2: the client follows the Link header.
    files, snapped = hub.client(
        ("list_repo_files", {"repo_id": REPO}),
        snap(sha, tmp_path / "m"),
    )
    assert _ok(files) == sorted(_tree(model_dir))
    assert _ok(snapped) and _tree(tmp_path / "m") == _tree(model_dir)
    assert hub.stats()["requests"]["tree"] >= 6


def test_new_commit_moves_main_and_old_sha_stays(start_hub, model_dir: Path, tmp_path: Path) -> None:
    hub = start_hub()
    old = hub_double.publish(hub.root, REPO, model_dir)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 16}) + "\n")
    new = hub_double.publish(hub.root, REPO, model_dir)  # while the double runs
    assert new != old
    info, at_old = hub.client(
        ("model_info", {"repo_id": REPO}),
        snap(old, tmp_path / "old"),
    )
    assert _ok(info)["sha"] == new
    assert _ok(at_old)
    assert json.loads((tmp_path / "old" / "config.json").read_text())["hidden_size"] == 8
