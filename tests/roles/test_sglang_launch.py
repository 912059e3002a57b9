"""roles/sglang/files/sglang_launch.py, the launcher the SGLang units run: the API key stays out of every
command line and every environment the server's processes can read, and out of what they print.

The launcher runs a real Python module (written here) the way the units run sglang.launch_server. The
module prints its ServerArgs with the key, as SGLang does at every start, and starts a worker process,
as SGLang starts its schedulers; the test then reads the kernel's view of each process
(/proc/PID/cmdline, /proc/PID/environ), what `ps` shows, and the output the journal would get.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "roles/sglang/files/sglang_launch.py"
KEY = "s3cr3t-key-for-the-launcher-test"

FAKE_SERVER = """
import os, subprocess, sys, time
from pathlib import Path
out = Path(os.environ["FAKE_OUT"])
key = sys.argv[sys.argv.index("--api-key") + 1] if "--api-key" in sys.argv else ""
print(f"server_args=ServerArgs(model_path='m', api_key={key!r})", file=sys.stderr, flush=True)
print("half a line with the key " + key[:5], end="", flush=True)
print(key[5:] + " and its end", flush=True)
worker = subprocess.Popen([sys.executable, "-c",
                           "import sys, time; print('worker got', sys.argv[1:], flush=True); time.sleep(60)",
                           "--from-server"])
(out / "server.pid").write_text(str(os.getpid()))
(out / "worker.pid").write_text(str(worker.pid))
(out / "key_seen").write_text(key)
if os.environ.get("FAKE_EXIT"):
    worker.kill()
    sys.exit(int(os.environ["FAKE_EXIT"]))
time.sleep(60)
"""


def _start(tmp_path: Path, key: str, credential: bool = False, **env: str) -> subprocess.Popen[bytes]:
    """The launcher running the fake server; the key in $SGLANG_API_KEY, or with `credential` as the
    units pass it: a file in $CREDENTIALS_DIRECTORY (systemd.exec(5), LoadCredential=)."""
    (tmp_path / "fakeserver.py").write_text(FAKE_SERVER)
    full_env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_API_KEY", "CREDENTIALS_DIRECTORY")}
    full_env.update(PYTHONPATH=str(tmp_path), FAKE_OUT=str(tmp_path), PYTHONUNBUFFERED="1", **env)
    if key and credential:
        creds = tmp_path / "credentials"
        creds.mkdir(mode=0o700)
        (creds / "sglang-api-key").write_text(key + "\n")
        full_env["CREDENTIALS_DIRECTORY"] = str(creds)
    elif key:
        full_env["SGLANG_API_KEY"] = key
    return subprocess.Popen(
        [sys.executable, str(LAUNCH), "fakeserver", "--port", "30000"],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _wait_for(path: Path) -> int:
    for _ in range(200):
        if path.is_file() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_the_key_reaches_the_server_inside_the_process_only(tmp_path: Path) -> None:
    proc = _start(tmp_path, KEY)
    try:
        server = _wait_for(tmp_path / "server.pid")
        worker = _wait_for(tmp_path / "worker.pid")
        time.sleep(0.3)
        assert (tmp_path / "key_seen").read_text() == KEY, "the server did not get --api-key KEY"
        for pid in (proc.pid, server, worker):
            assert KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), f"key in argv of {pid}"
        # /proc/PID/environ is the environment a process was exec'd with, readable only by its own user and
        # root (proc(5), PTRACE_MODE_READ): the launcher's holds the key, the processes the server starts
        # do not.
        assert KEY.encode() not in Path(f"/proc/{worker}/environ").read_bytes(), "key in a worker's environ"
        ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert KEY not in ps
        assert "sglang_launch.py fakeserver --port 30000" in ps
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    text = out.decode()
    assert KEY not in text and KEY[:5] not in text.replace("********", ""), text
    assert "server_args=ServerArgs(model_path='m', api_key='********')" in text, text
    assert "half a line with the key ******** and its end" in text, text
    assert "worker got ['--from-server']" in text, "a worker's output goes through the launcher too"
    assert proc.returncode == -signal.SIGTERM, "SIGTERM reaches the server, and the launcher ends by it too"


def test_a_key_from_the_units_credential_is_in_no_process_environment(tmp_path: Path) -> None:
    proc = _start(tmp_path, KEY, credential=True)
    try:
        server = _wait_for(tmp_path / "server.pid")
        worker = _wait_for(tmp_path / "worker.pid")
        time.sleep(0.3)
        assert (tmp_path / "key_seen").read_text() == KEY, "the server did not get the credential's key"
        for pid in (proc.pid, server, worker):
            assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes(), f"key in environ of {pid}"
            assert KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), f"key in argv of {pid}"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert KEY not in out.decode()
    assert "server_args=ServerArgs(model_path='m', api_key='********')" in out.decode()


@pytest.mark.parametrize("code", ["0", "3"])
def test_the_server_exit_status_is_the_launchers(tmp_path: Path, code: str) -> None:
    proc = _start(tmp_path, KEY, FAKE_EXIT=code)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == int(code), out.decode()
    assert KEY not in out.decode()


def test_without_a_key_the_module_runs_in_the_launcher_unchanged(tmp_path: Path) -> None:
    proc = _start(tmp_path, "", FAKE_EXIT="0")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    assert _wait_for(tmp_path / "server.pid") == proc.pid, "no key: no child process, no output copy"
    assert (tmp_path / "key_seen").read_text() == ""
    assert "api_key=''" in out.decode()


def test_no_module_is_a_usage_error() -> None:
    res = subprocess.run([sys.executable, str(LAUNCH)], capture_output=True, text=True)
    assert res.returncode == 2 and "usage: sglang_launch.py MODULE" in res.stderr


def _launcher_module() -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sglang_launch", LAUNCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _copy_through(chunks: list[bytes], key: str) -> bytes:
    """What the launcher's copy writes for output that arrives in these reads."""
    mod = _launcher_module()
    forms, pending, out = mod.key_forms(key), b"", b""
    for chunk in chunks:
        written, pending = mod.redact(pending + chunk, forms)
        out += written
    return out + (mod.MASK if pending else b"")


def test_a_key_inside_a_2_mib_line_split_across_reads_is_masked() -> None:
    """No newline for 2 MiB, and the key cut in two by the pipe's reads at the 1 MiB mark."""
    key = KEY.encode()
    line = b"x" * (1 << 20) + key + b"y" * (1 << 20) + b"\n"
    cut = (1 << 20) + 7  # inside the key
    chunks = [line[i : i + 65536] for i in range(0, cut, 65536)]
    chunks[-1] = line[(len(chunks) - 1) * 65536 : cut]
    chunks += [line[cut : cut + 13], line[cut + 13 :]]
    out = _copy_through(chunks, KEY)
    assert KEY.encode() not in out and KEY[:7].encode() + b"y" not in out
    assert out == b"x" * (1 << 20) + b"********" + b"y" * (1 << 20) + b"\n"


@pytest.mark.parametrize("printed", ["repr", "json", "json-ascii"])
def test_a_key_printed_in_escaped_form_is_masked(printed: str) -> None:
    """A key with quotes, a backslash and a non-ASCII letter, as repr() and json.dumps() write it."""
    import json

    key = "k'ey\"with\\odd-chärs"
    forms = {"repr": repr(key), "json": json.dumps(key, ensure_ascii=False), "json-ascii": json.dumps(key)}
    text = forms[printed]
    line = f"server_args=ServerArgs(api_key={text})\n".encode()
    out = _copy_through([line[:30], line[30:]], key)
    assert out.count(b"********") == 1, out
    for form in ("k'ey", "ey\\\"with", "odd-ch"):
        assert form.encode() not in out, out


def test_a_line_without_the_key_passes_unchanged_and_at_once() -> None:
    mod = _launcher_module()
    written, pending = mod.redact(b"INFO ready on port 30000\nstill going", mod.key_forms(KEY))
    assert (written, pending) == (b"INFO ready on port 30000\nstill going", b"")
    written, pending = mod.redact(b"api_key=" + KEY[:9].encode(), mod.key_forms(KEY))
    assert (written, pending) == (b"api_key=", KEY[:9].encode()), "the start of the key is held back"
