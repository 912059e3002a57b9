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
