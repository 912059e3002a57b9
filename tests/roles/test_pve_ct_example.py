"""`ansible-playbook playbooks/container.yml -i inventory/example --check --diff` against the Proxmox API
double: the production inventory, with only the endpoint, secrets and device directory pointed at this
machine (and the bind mount's source, which must exist), plans CT 200 (create, 8 GPUs, the bind mount)
without writing anything, and stops for the container that does not exist yet instead of failing on it.
A real Proxmox VE cannot run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pve_run import REPO, PveDouble, bind_source, fake_gpu_dev


def test_example_inventory_check_mode_shows_the_plan(tmp_path: Path) -> None:
    pve = PveDouble(tmp_path / "pve")
    pve.start()
    try:
        dev = fake_gpu_dev(tmp_path / "dev")
        overrides = {
            "ansible_connection": "local",  # pve1 is this machine; ct200 is never reached (it does not exist)
            "ansible_become": False,
            "ansible_python_interpreter": sys.executable,
            "pve_api_host": "127.0.0.1",
            "pve_ct_api_port": pve.port,
            "pve_ct_node": "pve1",
            "pve_api_ca_path": str(pve.ca),
            "pve_api_token_secret": pve.token.rpartition("=")[2],
            "pve_ct_host_dev_dir": str(dev),
            # the example's /tank/workspace, as a directory of this machine (the source must exist)
            "pve_ct_bind_mounts": [{"host_path": str(bind_source(tmp_path)), "mount_point": "/workspace"}],
        }
        varfile = tmp_path / "overrides.json"
        varfile.write_text(json.dumps(overrides))
        env = dict(
            os.environ, ANSIBLE_NOCOLOR="1", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        )
        cmd = [
            str(Path(sys.executable).with_name("ansible-playbook")),
            "-i",
            "inventory/example",
            "playbooks/container.yml",
            "--check",
            "--diff",
            "-e",
            f"@{varfile}",
        ]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert "would download local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst" in out
        # the diff of CT 200
        assert f"{bind_source(tmp_path)},mp=/workspace" in out and "/dev/nvidia7,gid=44,mode=0660" in out
        assert "ct200" in out and "unreachable=0" in out
        assert pve.state()["cts"] == {}
        assert [
            r for r in pve.requests() if r["method"] != "GET" and not r["path"].endswith("/access/ticket")
        ] == []
        assert pve.token.rpartition("=")[2] not in out
    finally:
        pve.stop()
