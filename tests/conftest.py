"""Shared pytest fixtures.

`s3_server`: a real S3 HTTP endpoint on loopback — moto's server (`moto_server`) started as a subprocess
once per session. moto is a faithful double of S3's HTTP API (buckets, multipart, pagination, metadata);
it is not AWS, so provider quirks (eventual consistency, throttling) are not reproduced. Tests that
simulate an outage call `.stop()` then `.start()`; moto keeps its state in memory, so a restart empties
every bucket (tests re-create what they need). Use `s3_server.reset()` for a clean slate.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

# The example inventory's hosts (10.0.1.x) are not on this machine's network. Tests that run a play far
# enough to see it try them assert that it tried; Ansible's own 30 s connect timeout would only add waiting.
os.environ.setdefault("ANSIBLE_TIMEOUT", "3")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """A `moto_server` subprocess on 127.0.0.1; `.endpoint_url`, `.stop()`, `.start()`, `.reset()`."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = None

    def _command(self) -> list[str]:
        exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        if not Path(exe).exists():
            raise RuntimeError("moto_server not found: install the dev extra (moto[server])")
        return [exe, "-H", "127.0.0.1", "-p", str(self.port)]

    def start(self, timeout: float = 30.0) -> None:
        if self.running:
            return
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        self._proc = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self._proc.returncode} on port {self.port}")
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto_server did not answer on {self.endpoint_url} within {timeout}s")

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API)."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    """A real S3 endpoint (moto's server) on loopback for the whole session."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
