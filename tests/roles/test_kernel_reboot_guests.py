"""The safe boot refuses to reboot a host whose guests run (a reboot stops CT 200 and any run inside it).

A real ansible-playbook run of role kernel's guest check (tasks_from boot_guests.yml, on localhost) against
a stand-in `pvesh` on PATH. The stand-in answers `pvesh get /nodes/localhost/{lxc,qemu} --output-format
json` the way the real one does: a JSON list of the node's guests with `vmid` (a number), `status` and
`name` (pve-container src/PVE/API2/LXC.pm and qemu-server PVE/API2/Qemu.pm `vmlist`, via
PVE::LXC::vmstatus / PVE::QemuServer::vmstatus), and an error for a path it does not know.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PVESH = """#!/usr/bin/env python3
import json, sys
guests = json.load(open({state!r}))
args = sys.argv[1:]
if args[:1] != ["get"] or "--output-format" not in args:
    sys.exit("stand-in pvesh: only 'get PATH --output-format json' is modelled")
path = args[1]
kinds = {{"/nodes/localhost/lxc": "lxc", "/nodes/localhost/qemu": "qemu"}}
if path not in kinds:
    sys.stderr.write("no such resource '" + path + "'\\n")
    sys.exit(2)
print(json.dumps([g for g in guests if g["type"] == kinds[path]]))
"""

_PLAY = """\
- name: Run role kernel's guest check
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    _kernel_target: 6.14.11-1-pve
  tasks:
    - name: Check the guests
      ansible.builtin.include_role:
        name: kernel
        tasks_from: boot_guests.yml
"""


def _run(tmp_path: Path, guests: list[dict] | None, *extra: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if guests is not None:
        state = tmp_path / "guests.json"
        state.write_text(json.dumps(guests))
        pvesh = bin_dir / "pvesh"
        pvesh.write_text(_PVESH.format(state=str(state)))
        pvesh.chmod(0o755)
    play = tmp_path / "play.yml"
    play.write_text(_PLAY)
    # PATH: the stand-in (when any) and the interpreter's directory, never the machine's own pvesh
    path = f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"
    env = dict(os.environ, PATH=path, ANSIBLE_FORCE_COLOR="0", ANSIBLE_ROLES_PATH=str(ROOT / "roles"))
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    return subprocess.run(
        [exe, "-i", "localhost,", str(play), "-e", f"ansible_python_interpreter={sys.executable}", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


CT200 = {"type": "lxc", "vmid": 200, "name": "ct200", "status": "running"}
VM101 = {"type": "qemu", "vmid": 101, "name": "ci-runner", "status": "running"}


def test_running_guests_stop_the_reboot_and_are_named(tmp_path: Path) -> None:
    r = _run(tmp_path, [CT200, VM101, {**CT200, "vmid": 201, "name": "old", "status": "stopped"}])
    assert r.returncode != 0
    out = r.stdout + r.stderr
    want = ("refusing to reboot localhost into 6.14.11-1-pve: "
            "guests are running (lxc 200 ct200, qemu 101 ci-runner)")
    assert want in " ".join(out.split())
    assert "old" not in out.split("guests are running")[1].split(")")[0]
    assert "kernel_boot_with_guests_running=true" in out


@pytest.mark.parametrize("guests", [[], [{**CT200, "status": "stopped"}], None],
                         ids=["none", "stopped", "no-pvesh"])
def test_no_running_guest_lets_the_reboot_go_on(tmp_path: Path, guests: list[dict] | None) -> None:
    r = _run(tmp_path, guests)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]


def test_the_user_can_allow_it(tmp_path: Path) -> None:
    r = _run(tmp_path, [CT200], "-e", "kernel_boot_with_guests_running=true")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
