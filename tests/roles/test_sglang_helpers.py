"""Python helpers of role sglang, and the stand-in SGLang wheels of its molecule scenario and the lab.

The stand-in wheels (tests/doubles/standins/sglang_standin_wheels.py) are installed here with pip, as uv
installs them on the node, and run as the units run SGLang: `python -m sglang.launch_server` (wraps the
SGLang double, tests/doubles/sglang_server.py, because SGLang cannot serve on CPU) and
`python -m sglang_router.launch_router` (stands in for the Rust sglang-router). The model helper is
exercised on local directories and on a real S3 endpoint on loopback (moto's server, `s3_server`
fixture); hf:// sources need the hub, which no test may reach, so only their error path (no
huggingface_hub) is tested.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "sglang" / "files"
MODEL_FILES = ROOT / "roles" / "model" / "files"  # role model's fetch helper, which role sglang uses
DOUBLE = ROOT / "tests" / "doubles" / "sglang_server.py"
STANDIN = ROOT / "tests" / "doubles" / "standins"


def _load(name: str) -> ModuleType:
    path = MODEL_FILES / "model_fetch.py" if name == "model_fetch" else FILES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, json.loads(r.read())


def _wait(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _get(url)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer 200 within {timeout}s")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.terminate()
        p.wait(timeout=10)


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in wheels, built and installed by a real installer (pip --no-index) into a target dir."""
    out = tmp_path_factory.mktemp("standin")
    subprocess.run(
        [
            sys.executable,
            str(STANDIN / "sglang_standin_wheels.py"),
            str(out / "wheels"),
            "--sglang-version",
            "0.5.23",
            "--router-version",
            "0.3.2",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-index",
            "--find-links",
            str(out / "wheels"),
            "--target",
            str(out / "site"),
            "sglang==0.5.23",
            "sglang-router==0.3.2",
        ],
        check=True,
        capture_output=True,
    )
    return out / "site"


def _module(site: Path, module: str, *argv: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.Popen([sys.executable, "-m", module, *argv], env=env, **kw)


def test_standin_wheels_are_the_pinned_distributions(standin: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.metadata as m; print(m.version('sglang'), m.version('sglang-router'))",
        ],
        env=dict(os.environ, PYTHONPATH=str(standin)),
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.split() == ["0.5.23", "0.3.2"]
    assert (standin / "sglang" / "_double.py").read_bytes() == DOUBLE.read_bytes()


def test_launch_standin_refuses_an_argument_sglang_does_not_know(standin: Path) -> None:
    p = _module(
        standin,
        "sglang.launch_server",
        "--model-path",
        "/m",
        "--port",
        "1",
        "--no-such-flag",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = p.communicate(timeout=30)
    assert p.returncode == 2 and "unrecognized arguments: --no-such-flag" in err


def _launch_standin(standin: Path, port: int, *extra: str) -> subprocess.Popen:
    """The stand-in as the unit runs it (python -m sglang.launch_server), with SGLang's arguments."""
    argv = [
        "--model-path",
        "/models/Qwen3.6-27B",
        "--served-model-name",
        "tiny-qwen",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp-size",
        "1",
        "--mem-fraction-static",
        "0.85",
        "--reasoning-parser",
        "qwen3",
        *extra,
    ]
    return _module(standin, "sglang.launch_server", *argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_launch_standin_takes_sglang_arguments_and_serves_the_double(standin: Path, procs: list) -> None:
    port = _port()
    procs.append(_launch_standin(standin, port, "--api-key", "k1"))
    _wait(f"http://127.0.0.1:{port}/health")
    assert _get(f"http://127.0.0.1:{port}/v1/models")[0] == 401, "--api-key was not passed to the double"
    status, body = _post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400},
        {"Authorization": "Bearer k1"},
    )
    assert status == 200
    assert body["model"] == "tiny-qwen"
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"].startswith("Thinking "), "--reasoning-parser qwen3 was not passed on"
    info = json.loads(_get(f"http://127.0.0.1:{port}/get_model_info", {"Authorization": "Bearer k1"})[1])
    assert info["model_path"] == "tiny-qwen"


def test_launch_standin_never_healthy_switch(standin: Path, procs: list) -> None:
    port = _port()
    procs.append(_launch_standin(standin, port, "--standin-never-healthy"))
    deadline = time.monotonic() + 20
    status = None
    while time.monotonic() < deadline:
        try:
            status = _get(f"http://127.0.0.1:{port}/health")[0]
            break
        except OSError:
            time.sleep(0.1)
    assert status == 503
    assert _get(f"http://127.0.0.1:{port}/health_generate")[0] == 503


def test_router_standin_spreads_requests_and_fails_over(standin: Path, procs: list) -> None:
    ports = [_port(), _port()]
    for p in ports:
        procs.append(
            subprocess.Popen(
                [sys.executable, str(DOUBLE), "--port", str(p), "--model", "m"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    rport = _port()
    router = _module(
        standin,
        "sglang_router.launch_router",
        *[
            "--host",
            "127.0.0.1",
            "--port",
            str(rport),
            "--policy",
            "cache_aware",
            "--worker-urls",
            *[f"http://127.0.0.1:{p}" for p in ports],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.append(router)
    for p in [*ports, rport]:
        _wait(f"http://127.0.0.1:{p}/health")
    for i in range(6):
        status, body = _post(
            f"http://127.0.0.1:{rport}/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]},
        )
        assert status == 200 and body["choices"][0]["message"]["content"]
    served = [json.loads(_get(f"http://127.0.0.1:{p}/double/stats")[1])["served"] for p in ports]
    assert sum(served) == 6 and min(served) >= 2, f"router did not spread the load: {served}"
    procs[0].terminate()
    procs[0].wait(timeout=10)
    for i in range(3):
        assert (
            _post(
                f"http://127.0.0.1:{rport}/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": f"after {i}"}]},
            )[0]
            == 200
        )


@pytest.mark.parametrize(
    ("host", "url_host"),
    [
        ("0.0.0.0", "127.0.0.1"),  # any address: probed on loopback
        ("::1", "[::1]"),  # an IPv6 literal goes in brackets in a URL (RFC 3986), not an unparsable ADDR:PORT
    ],
)
def test_wait_ready_names_the_url_on_timeout(host: str, url_host: str) -> None:
    port = _port()
    r = subprocess.run(
        [sys.executable, str(FILES / "sglang_wait_ready.py"), host, str(port), "--timeout", "1.5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    assert f"http://{url_host}:{port}/health not ready after 2 s" in r.stderr
    assert "nonnumeric port" not in r.stderr and "Invalid" not in r.stderr


def _model(root: Path, shard_bytes: int = 16, total: int = 20) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "qwen3"}')
    (root / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": total}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}
        )
    )
    (root / "s1.safetensors").write_bytes(b"x" * shard_bytes)
    (root / "s2.safetensors").write_bytes(b"y" * shard_bytes)
    (root / "sub").mkdir()
    (root / "sub" / "tokenizer.json").write_text("{}")
    return root


def test_model_fetch_local_then_verify_detects_truncation(tmp_path: Path) -> None:
    m = _load("model_fetch")
    src = _model(tmp_path / "src")
    dest = tmp_path / "dest"
    files = m.fetch(str(src), dest)
    assert files == {
        "config.json": 23,
        "model.safetensors.index.json": files["model.safetensors.index.json"],
        "s1.safetensors": 16,
        "s2.safetensors": 16,
        "sub/tokenizer.json": 2,
    }
    assert m.verify(dest) == files
    (dest / "s2.safetensors").write_bytes(b"y" * 5)
    with pytest.raises(m.ModelError, match=r"s2.safetensors: 5 bytes on disk, manifest says 16"):
        m.verify(dest)
    (dest / "s2.safetensors").unlink()
    with pytest.raises(m.ModelError, match=r"s2\.safetensors: listed in the manifest but missing"):
        m.verify(dest)


def test_model_fetch_refuses_incomplete_models(tmp_path: Path) -> None:
    m = _load("model_fetch")
    src = _model(tmp_path / "src")
    (src / "s2.safetensors").unlink()
    with pytest.raises(m.ModelError, match=r"1 shard.*missing: s2\.safetensors"):
        m.fetch(str(src), tmp_path / "d1")
    assert not (tmp_path / "d1" / ".model.json").exists(), "a failed fetch must leave no manifest"
    small = _model(tmp_path / "small", shard_bytes=4, total=100)
    with pytest.raises(m.ModelError, match="shards hold 8 bytes, fewer than the index's total_size 100"):
        m.fetch(str(small), tmp_path / "d2")
    with pytest.raises(m.ModelError, match=r"no \.model\.json"):
        m.verify(tmp_path / "d2")
    with pytest.raises(m.ModelError, match="unsupported model source"):
        m.fetch("https://example.invalid/model", tmp_path / "d3")


def test_model_fetch_cli_reports_errors_by_exit_code(tmp_path: Path) -> None:
    src = _model(tmp_path / "src")
    script = str(MODEL_FILES / "model_fetch.py")
    ok = subprocess.run(
        [sys.executable, script, "fetch", str(src), str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {
        "files": 5,
        "bytes": sum(p.stat().st_size for p in src.rglob("*") if p.is_file()),
    }
    bad = subprocess.run(
        [sys.executable, script, "verify", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "no .model.json" in bad.stderr


def test_model_fetch_from_s3(tmp_path: Path, s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    m = _load("model_fetch")
    src = _model(tmp_path / "src")
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name="us-east-1")
    s3.create_bucket(Bucket="models")
    for p in src.rglob("*"):
        if p.is_file():
            s3.upload_file(str(p), "models", f"qwen/tiny/{p.relative_to(src).as_posix()}")
    s3.put_object(Bucket="models", Key="qwen/tiny-other/config.json", Body=b"{}")
    monkeypatch.setenv("S3_ENDPOINT_URL", s3_server.endpoint_url)
    files = m.fetch("s3://models/qwen/tiny", tmp_path / "dest")
    assert sorted(files) == [
        "config.json",
        "model.safetensors.index.json",
        "s1.safetensors",
        "s2.safetensors",
        "sub/tokenizer.json",
    ], "the prefix must not match qwen/tiny-other/"
    assert m.verify(tmp_path / "dest") == files
    with pytest.raises(m.ModelError, match="no objects under this prefix"):
        m.fetch("s3://models/nothing-here", tmp_path / "empty")


@pytest.mark.parametrize("hostile", ["/{abs}", "../../sentinel", "sub/../../../sentinel"])
def test_model_fetch_from_s3_refuses_keys_that_leave_dest(
    tmp_path: Path, s3_server, hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 stores `qwen/tiny//abs/path` and `qwen/tiny/../../x` like any key; joined as they are, pathlib
    drops dest before the absolute part and `..` climbs out of it. The fetch (the CLI, as the role runs
    it) fails naming the key, and writes nothing, inside dest or out."""
    import boto3

    src = _model(tmp_path / "src")
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name="us-east-1")
    bucket = f"hostile-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    for p in src.rglob("*"):
        if p.is_file():
            s3.upload_file(str(p), bucket, f"qwen/tiny/{p.relative_to(src).as_posix()}")
    sentinel = tmp_path / "sentinel"
    key = "qwen/tiny/" + hostile.format(abs=sentinel)
    s3.put_object(Bucket=bucket, Key=key, Body=b"evil")
    assert key in [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    dest = tmp_path / "a" / "dest"
    env = {**os.environ, "S3_ENDPOINT_URL": s3_server.endpoint_url}  # credentials: set by s3_server
    r = subprocess.run(
        [sys.executable, str(MODEL_FILES / "model_fetch.py"), "fetch", f"s3://{bucket}/qwen/tiny", str(dest)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"model: s3://{bucket}/{key}: unsafe object key" in r.stderr, r.stderr
    assert not sentinel.exists()
    assert not [p for p in dest.rglob("*")], "nothing may be written when one key is refused"
    # the same in-process (the module's own error type)
    monkeypatch.setenv("S3_ENDPOINT_URL", s3_server.endpoint_url)
    m = _load("model_fetch")
    with pytest.raises(m.ModelError, match="unsafe object key"):
        m.fetch(f"s3://{bucket}/qwen/tiny", dest)
    assert not sentinel.exists() and not (dest / "config.json").exists()


def test_model_fetch_refuses_a_symlink_in_dest_that_points_out(tmp_path: Path) -> None:
    m = _load("model_fetch")
    src = _model(tmp_path / "src")
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(m.ModelError, match=r"sub/tokenizer\.json: cannot be copied .*outside"):
        m.fetch(str(src), dest)
    assert not list(outside.iterdir()) and not (dest / "config.json").exists()


def test_model_helper_runs_with_safepath_copied_beside_it(tmp_path: Path) -> None:
    """On the node the trainer package is absent: the role copies trainer/safepath.py next to the
    helper. `python -S` (no site-packages, so no trainer package) proves the helper needs nothing else."""
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    (libexec / "model_fetch.py").write_bytes((MODEL_FILES / "model_fetch.py").read_bytes())
    (libexec / "safepath.py").write_bytes((ROOT / "trainer" / "safepath.py").read_bytes())
    src = _model(tmp_path / "src")
    (tmp_path / "outside").mkdir()
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "sub").symlink_to(tmp_path / "outside")
    run = [sys.executable, "-S", str(libexec / "model_fetch.py"), "fetch", str(src)]
    r = subprocess.run([*run, str(tmp_path / "dest")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot be copied" in r.stderr and "outside" in r.stderr, r.stderr
    ok = subprocess.run([*run, str(tmp_path / "d2")], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["files"] == 5, ok.stderr
    (libexec / "safepath.py").unlink()
    gone = subprocess.run([*run, str(tmp_path / "d3")], capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and "No module named 'trainer'" in gone.stderr, gone.stderr


def test_model_fetch_from_hf_without_huggingface_hub_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hf:// downloads need the hub (unreachable from tests): only the missing-library error is checked."""
    m = _load("model_fetch")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(
        m.ModelError, match=r"hf://Qwen/Qwen3\.6-27B: an hf:// model source needs huggingface_hub"
    ):
        m.fetch("hf://Qwen/Qwen3.6-27B", tmp_path / "dest")
    assert not (tmp_path / "dest" / ".model.json").exists()


def test_model_verify_checks_the_source_it_was_fetched_from(tmp_path: Path) -> None:
    m = _load("model_fetch")
    src = _model(tmp_path / "src")
    m.fetch(str(src), tmp_path / "dest")
    assert m.verify(tmp_path / "dest", str(src))
    # A new revision (hf://org/name@sha) or another source must trigger a fetch, not pass the check.
    with pytest.raises(m.ModelError, match=r"fetched from '.*src', not 'hf://Qwen/Qwen3.6-27B@abc'"):
        m.verify(tmp_path / "dest", "hf://Qwen/Qwen3.6-27B@abc")


def test_model_stage_copies_once_and_refuses_without_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _load("model_fetch")
    src = _model(tmp_path / "src")
    m.fetch(str(src), tmp_path / "model")
    staged = tmp_path / "shm" / "model"
    files = m.stage(tmp_path / "model", staged)
    assert m.verify(staged) == files
    before = (staged / "s1.safetensors").stat().st_mtime_ns
    m.stage(tmp_path / "model", staged)  # already there: kept as it is
    assert (staged / "s1.safetensors").stat().st_mtime_ns == before
    (staged / "s1.safetensors").write_bytes(b"x")  # damaged copy: staged again
    assert m.stage(tmp_path / "model", staged) == files and m.verify(staged) == files
    with pytest.raises(m.ModelError, match=r"no .model.json"):
        m.stage(src, tmp_path / "shm" / "other")  # only a verified model is staged
    monkeypatch.setattr(m.shutil, "disk_usage", lambda p: type("U", (), {"free": 10})())
    with pytest.raises(m.ModelError, match=r"staging .* needs 0.00 GiB, only 0.00 GiB free there"):
        m.stage(tmp_path / "model", tmp_path / "shm2" / "model")


def test_router_standin_with_a_key_refuses_callers_without_it(standin: Path, procs: list) -> None:
    """As the real router's auth middleware: no key or another key is 401, nothing reaches a worker."""
    port = _port()
    procs.append(_launch_standin(standin, port, "--api-key", "k1"))
    rport = _port()
    procs.append(
        _module(
            standin,
            "sglang_router.launch_router",
            *["--host", "127.0.0.1", "--port", str(rport), "--policy", "round_robin"],
            *["--worker-urls", f"http://127.0.0.1:{port}", "--api-key", "k1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    _wait(f"http://127.0.0.1:{port}/health")
    _wait(f"http://127.0.0.1:{rport}/health")  # the health probe is open
    body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    url = f"http://127.0.0.1:{rport}/v1/chat/completions"
    for headers in ({}, {"Authorization": "Bearer k2"}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(url, body, headers)
        assert refused.value.code == 401
    stats = {"Authorization": "Bearer k1"}
    assert json.loads(_get(f"http://127.0.0.1:{port}/double/stats", stats)[1])["served"] == 0
    assert _post(url, body, {"Authorization": "Bearer k1"})[0] == 200


def test_model_fetch_fetches_a_damaged_copy_again(tmp_path: Path) -> None:
    """A file whose size no longer matches the manifest fails verify, and the next fetch replaces it."""
    m = _load("model_fetch")
    src = _model(tmp_path / "src")
    dest = tmp_path / "dest"
    m.fetch(str(src), dest)
    good = (dest / "s1.safetensors").read_bytes()
    (dest / "s1.safetensors").write_bytes(good[:2])
    with pytest.raises(m.ModelError, match=r"s1\.safetensors: 2 bytes on disk, manifest says"):
        m.verify(dest, str(src))
    m.fetch(str(src), dest)
    assert (dest / "s1.safetensors").read_bytes() == good
    assert m.verify(dest, str(src)) == m.scan(src)
