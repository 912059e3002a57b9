"""The lab on a machine that never ran it: its S3 double starts before any container has joined the lab
network.

podman records a network when `podman network create` runs, but (CNI backend, Debian 12's podman 4.3) its
bridge and the gateway address come up only when the first container joins it. The lab starts its S3
double before any lab container exists, so a double bound to the gateway failed on every fresh machine
("Cannot assign requested address") while a machine that had run the lab before kept the bridge up and
passed. The test runs the lab's own tasks (lab/playbook.yml, tag lab_s3) against a network that does not
exist yet, with no container on it, as a first bin/lab does; it needs root and podman, and uses its own
network name, port and state directory, so a running lab is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import _free_port
from tests.doubles import s3_lab

REPO = Path(__file__).resolve().parents[1]


def _addresses() -> set[str]:
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    return {a["local"] for link in json.loads(out) for a in link.get("addr_info", [])}


def _podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False)


def test_an_address_that_is_not_this_machines_is_named():
    # 198.51.100.0/24 is TEST-NET-2 (RFC 5737): on no interface here, as a gateway before its bridge is up.
    with pytest.raises(SystemExit) as exc:
        s3_lab.check_bindable("198.51.100.77", _free_port())
    assert "198.51.100.77" in str(exc.value) and "no interface of this machine" in str(exc.value)


def test_a_taken_port_is_named():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            s3_lab.check_bindable("0.0.0.0", port)
    assert f"holds port {port}" in str(exc.value)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("podman"),
                    reason="needs root and podman (bin/bootstrap installs podman)")
def test_the_lab_s3_double_starts_on_a_network_no_container_has_joined(tmp_path):
    network, port = f"gpu-lab-t{os.getpid()}", _free_port()
    _podman("network", "rm", "-f", network)
    state = tmp_path / "lab"
    state.mkdir()
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "inventory/lab", "lab/playbook.yml",
           "--tags", "lab_s3", "-e", f"lab_network={network}", "-e", f"lab_s3_port={port}",
           "-e", f"_lab={state}"]
    bridge = ""
    try:
        run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False,
                             env={**os.environ, "ANSIBLE_FORCE_COLOR": "0"})
        info = json.loads(_podman("network", "inspect", network).stdout or "[{}]")[0]
        bridge = info.get("network_interface", "")
        gateway = info["subnets"][0]["gateway"] if info.get("subnets") else ""
        # The condition of a fresh machine: the lab made the network, and its gateway is on no interface.
        assert gateway, f"the lab did not create network {network}:\n{run.stdout[-3000:]}"
        assert gateway not in _addresses(), (
            f"{gateway} is already up here (a bridge left by an earlier network: `ip link delete` it), "
            "so this test cannot show a first run")
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        assert (state / "s3-endpoint").read_text() == f"http://{gateway}:{port}\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab-runs", timeout=10) as resp:  # the bucket
            assert resp.status == 200
        # A second run finds it running.
        again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    finally:
        s3_lab.stop(state / "s3")
        _podman("network", "rm", "-f", network)
        left = subprocess.run(["ip", "link", "show", "dev", bridge], capture_output=True, check=False)
        if bridge and left.returncode == 0:  # CNI keeps a network's bridge after the network is removed
            subprocess.run(["ip", "link", "delete", bridge], check=False)

