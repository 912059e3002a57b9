"""Start the Proxmox API double (pve_api.py) for tests: a test-only CA and server certificate made with
openssl, the double as a subprocess on a free loopback port, and helpers to read its state and request log.
Starting it also points the `pct` stand-in (standins/pct) at it, through $PCT_STANDIN_CONFIG, so that a role
run on this machine as its "Proxmox host" sets the root-only keys with `pct set` as on a real host.

A real Proxmox VE cannot run here; this double serves the same HTTP API shapes (see pve_api.py)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve().parent
PCT = HERE / "standins" / "pct"
TOKEN_USER = "root@pam"
TOKEN_ID = "ansible"
TOKEN_SECRET = "0b6a1f4e-2c1d-4d8e-9a57-5f3c8e2d7b10"
ROOT_PASSWORD = "double-root-password-7f3a"


def make_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost signed by it: (ca, cert, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        "/CN=pve_ct test CA",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )
    return ca, cert, key


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PveDouble:
    """The double running on https://127.0.0.1:PORT with state and request log under `directory`."""

    # The `pct` stand-in's config of each running double, by port: run_role points pct at the double whose
    # port the role's variables name (a test may hold several doubles).
    PCT_CONFIGS: ClassVar[dict[int, Path]] = {}

    def __init__(
        self,
        directory: Path,
        token_secret: str = TOKEN_SECRET,
        root_password: str = ROOT_PASSWORD,
        token_privsep: bool = False,
        token_acl: dict[str, list[str]] | None = None,
        dev_root: Path | None = None,
    ) -> None:
        self.dev_root = dev_root  # the host's / for devN paths (pve_api.py --dev-root); None: not checked
        self.token_privsep = token_privsep
        self.token_acl = token_acl or {}
        self.dir = directory
        self.ca, self.cert, self.key = make_ca(directory / "tls")
        self.state_path = directory / "pve-state.json"
        self.log_path = directory / "pve-requests.jsonl"
        self.pve_dir = directory / "etc-pve"
        self.port = _free_port()
        self.token = f"{TOKEN_USER}!{TOKEN_ID}={token_secret}"
        self.root_password = root_password
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0, boot: bool = False) -> None:
        """Start the double; `boot`: this start is the host's boot (pve-guests starts the onboot CTs)."""
        self._proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "pve_api.py"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--cert",
                str(self.cert),
                "--key",
                str(self.key),
                "--state",
                str(self.state_path),
                "--token",
                self.token,
                "--log",
                str(self.log_path),
                "--pve-dir",
                str(self.pve_dir),
                "--root-password",
                self.root_password,
                "--token-privsep",
                str(int(self.token_privsep)),
                # The role's "host" is this machine: bind-mount sources are checked on its filesystem.
                "--bind-root",
                "/",
                *(["--dev-root", str(self.dev_root)] if self.dev_root is not None else []),
                *(["--boot"] if boot else []),
                *[
                    a
                    for path, privs in self.token_acl.items()
                    for a in ("--token-acl", f"{path}={','.join(privs)}")
                ],
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.pct_config = self.dir / "pct-standin.json"
        self.pct_config.write_text(
            json.dumps(
                {
                    "url": f"https://127.0.0.1:{self.port}/api2/json",
                    "ca": str(self.ca),
                    "node": "pve1",
                    "password": self.root_password,
                }
            )
        )
        self.pct_config.chmod(0o600)
        PveDouble.PCT_CONFIGS[self.port] = self.pct_config
        os.environ["PCT_STANDIN_CONFIG"] = str(self.pct_config)  # the latest double, for plays run directly
        ctx = ssl.create_default_context(cafile=str(self.ca))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"pve_api double exited: {self._proc.stderr.read().decode() if self._proc.stderr else ''}"
                )
            try:
                with (
                    socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw,
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1"),
                ):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pve_api double did not answer on port {self.port}")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._proc = None

    def reboot(self, before_guests: Callable[[], None]) -> None:
        """A host reboot: the host goes down (the double stops, its CTs with it), `before_guests` runs the
        boot's units ordered before pve-guests.service, then the double starts as the booted host's API,
        pve-guests having started the onboot CTs."""
        self.stop()
        before_guests()
        self.start(boot=True)

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())

    def requests(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines()]

    def clear_log(self) -> None:
        self.log_path.write_text("")

    def role_vars(self) -> dict[str, Any]:
        """The pve_ct variables that point the role at this double (its API token; the root-only keys go
        through the `pct` stand-in, which run_role puts on PATH)."""
        return {
            "pve_ct_api_host": "127.0.0.1",
            "pve_ct_api_port": self.port,
            "pve_ct_api_user": TOKEN_USER,
            "pve_ct_api_token_id": TOKEN_ID,
            "pve_ct_api_token_secret": self.token.rpartition("=")[2],
            "pve_ct_api_ca_path": str(self.ca),
            "pve_ct_node": "pve1",
            "pve_ct_pve_dir": str(self.pve_dir),
        }
