#!/usr/bin/env python3
"""The lab's S3: moto's server (a double of S3's HTTP API; no real bucket can be used here) as a daemon on
this machine, with the lab's bucket made, so that the nodes of the lab's multi-node run share their shards
and checkpoints through S3 as production nodes do. moto keeps its objects in memory: a restart of the
daemon empties the bucket, as a new bucket would be.

The lab binds it to every address (0.0.0.0), and the nodes reach it on the lab network's gateway: podman
records a network when it is created, but its bridge and the gateway address come up only when the first
container joins it, so on a machine that never ran the lab nothing can bind the gateway before then.

    s3_lab.py start --dir .lab/s3 --host 0.0.0.0 --port 5090 --bucket lab-runs   # prints started/running
    s3_lab.py stop --dir .lab/s3                                              # bin/lab down
    s3_lab.py wait --url URL --bucket B --key K [--timeout S]                 # until the object exists
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

try:  # imported as tests.doubles.s3_lab, or run from its folder
    from .pve_api_lab import _alive, serving  # the pid in a pidfile, when that process lives
except ImportError:
    from pve_api_lab import _alive, serving  # type: ignore[no-redef]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
            return True
    except (OSError, urllib.error.URLError):
        return False


def _make_bucket(url: str, bucket: str) -> None:
    """PUT /BUCKET (S3 CreateBucket); an existing one answers 409 BucketAlreadyOwnedByYou."""
    req = urllib.request.Request(f"{url}/{bucket}", method="PUT", data=b"")
    try:
        with urllib.request.urlopen(req, timeout=10):
            pass
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise SystemExit(f"the S3 double at {url} refused to make bucket {bucket}: HTTP {e.code}") \
                from None


def other_doubles(port: int) -> list[int]:
    """The pids of moto servers on `port` (another checkout's lab, or a bin/lab cut short, left running)."""
    return serving(b"moto_server", b"-p", port)


def check_bindable(host: str, port: int) -> None:
    """SystemExit naming the address or the port when moto could not listen there: an address that is not
    this machine's (EADDRNOTAVAIL: a podman network's gateway before a container has joined it) or a port
    another program holds (EADDRINUSE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as moto's server (werkzeug) binds
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise SystemExit(f"the S3 double cannot listen on {host}: no interface of this machine has "
                                 "that address (a podman network's gateway exists only once a container has "
                                 "joined the network)") from None
            if e.errno == errno.EADDRINUSE:
                raise SystemExit(f"the S3 double cannot listen on {host}:{port}: another program holds port "
                                 f"{port} (`ss -ltnp 'sport = :{port}'` names it)") from None
            raise SystemExit(f"the S3 double cannot listen on {host}:{port}: {e}") from None


def start(directory: Path, host: str, port: int, bucket: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    # 0.0.0.0 is every address: the daemon is checked on loopback.
    pidfile, url = directory / "moto.pid", f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    if _alive(pidfile) and _answers(url):
        _make_bucket(url, bucket)
        return "running"
    stop(directory)
    for pid in other_doubles(port):  # one lab per machine: its S3 is ours now
        print(f"stopping another lab's S3 double (pid {pid}) on port {port}", file=sys.stderr)
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.1)
    check_bindable(host, port)
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        raise SystemExit(f"{exe} not found: the controller's venv needs the dev extra (moto[server])")
    with (directory / "moto.log").open("ab") as log:
        proc = subprocess.Popen([str(exe), "-H", host, "-p", str(port)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=log, close_fds=True, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    deadline = time.monotonic() + 30
    while not _answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the S3 double did not answer on {url} within 30 s (see {directory}/moto.log)")
        time.sleep(0.2)
    _make_bucket(url, bucket)
    return "started"


def stop(directory: Path) -> str:
    pidfile = directory / "moto.pid"
    pid = _alive(pidfile)
    if pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not _alive(pidfile):
                break
            time.sleep(0.1)
    pidfile.unlink(missing_ok=True)
    return "stopped" if pid else "not running"


def wait(url: str, bucket: str, key: str, timeout: float) -> str:
    """Until s3://bucket/key exists (a signed HEAD: the objects the runs upload are private, and moto
    answers an anonymous one 403); SystemExit naming it after `timeout` seconds."""
    import boto3  # the controller's venv has it (the trainer's S3 client)

    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="lab",
                          aws_secret_access_key="lab")  # moto takes any key
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.head_object(Bucket=bucket, Key=key)
            return f"s3://{bucket}/{key} is there"
        except Exception:  # 404 until the upload has put it there (or the double is restarting)
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"s3://{bucket}/{key} did not appear at {url} within {timeout:g} s")
        time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, default=5090)
    s.add_argument("--bucket", required=True)
    t = sub.add_parser("stop")
    t.add_argument("--dir", type=Path, required=True)
    w = sub.add_parser("wait")
    w.add_argument("--url", required=True)
    w.add_argument("--bucket", required=True)
    w.add_argument("--key", required=True)
    w.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    if a.cmd == "wait":
        print(wait(a.url, a.bucket, a.key, a.timeout))
    else:
        print(start(a.dir, a.host, a.port, a.bucket) if a.cmd == "start" else stop(a.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
