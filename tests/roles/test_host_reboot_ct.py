"""A host reboot with CT 200 on autostart: CT 200 is running afterwards, given its GPU nodes.

Real here: the nvidia-dev-nodes script and unit, rendered by Ansible's template module from role
nvidia_open's templates with its defaults; the script runs under /bin/sh with real mknod, chroot'ed into a
scratch root (in a private mount namespace, /usr bind-mounted read-only), and its nodes are real device
nodes; CT 200 is created and started through the real proxmoxer.

Doubles, because no GPU, NVIDIA driver or Proxmox VE can run here:
- the kernel's side of the driver: files in the scratch root where the driver publishes them:
  /proc/devices (nvidia-frontend 195; nvidia-uvm and nvidia-caps with dynamic majors, new ones at each
  boot), /proc/driver/nvidia/{version,params,gpus/*/information,capabilities/mig/*}, /sys/module/*/initstate.
- nvidia-modprobe: tests/doubles/standins/nvidia-modprobe, which follows nvidia-modprobe's source (which
  flag makes which node, from which numbers, and its silent exit 1).
- Proxmox VE: tests/doubles/pve_api.py with --dev-root at the scratch root, so creating, configuring and
  starting a CT stat each devN path there, and a missing one fails as pve-container fails it: "Device PATH
  does not exist" (PVE::LXC::Tools::get_device_mode_and_rdev, from update_lxc_config, before lxc-start and
  its prestart hook run; see pve_api.Api._passthrough); its /etc/pve is bind-mounted at the scratch
  root's /etc/pve, where the script reads the CT configs. A reboot (PveDouble.reboot): the host goes
  down with its CTs, /dev starts empty, the units ordered before pve-guests.service run (here the
  rendered unit's ExecStart), then pve-guests' startall starts the onboot CTs.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pve_run import REPO, PveDouble, default_state, wait_task

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="device nodes (mknod), mounts and chroot need root, as on a Proxmox host"
)

STANDIN = REPO / "tests" / "doubles" / "standins" / "nvidia-modprobe"
TEMPLATE = "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"
GPUS = 8
# The unit as it was: one -c per GPU, then uvm and modeset. -c N never makes /dev/nvidiactl (195:255).
OLD_UNIT = """set -eu
n=$(ls -d /proc/driver/nvidia/gpus/* 2>/dev/null | wc -l)
i=0
while [ "$i" -lt "$n" ]; do nvidia-modprobe -c="$i"; i=$((i + 1)); done
nvidia-modprobe -u -c=0
nvidia-modprobe -m
"""
_PLAY = """\
- name: Render the device-node script and unit as role nvidia_open does
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files: [{defaults}]
  tasks:
    - name: Render the script
      ansible.builtin.template:
        src: {templates}/nvidia-dev-nodes.sh.j2
        dest: {out}/nvidia-dev-nodes
        mode: "0755"
    - name: Render the unit
      ansible.builtin.template:
        src: {templates}/nvidia-dev-nodes.service.j2
        dest: {out}/nvidia-dev-nodes.service
        mode: "0644"
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rendered")
    role = REPO / "roles" / "nvidia_open"
    play = out / "render.yml"
    defaults = role / "defaults" / "main.yml"
    play.write_text(_PLAY.format(defaults=defaults, templates=role / "templates", out=out))
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    proc = subprocess.run(
        [exe, "-i", "localhost,", str(play), "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def unit_file(rendered: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((rendered / "nvidia-dev-nodes.service").read_text())
    return unit


def write_kernel(
    root: Path, uvm_major: int | None, caps_major: int, gpus: int = GPUS, mig_instance: bool = False
) -> None:
    """What the loaded driver publishes at this boot (a fresh /proc and /sys). `mig_instance`: a MIG GPU
    instance exists (created after boot; instances do not survive a reboot), with its access capability."""
    for d in ("proc", "sys"):
        shutil.rmtree(root / d, ignore_errors=True)
    chars = ["  1 mem", "  5 /dev/tty", " 10 misc", "195 nvidia-frontend", f"{caps_major} nvidia-caps"]
    if uvm_major is not None:
        chars.append(f"{uvm_major} nvidia-uvm")
    (root / "proc").mkdir()
    (root / "proc" / "devices").write_text(
        "Character devices:\n" + "\n".join(chars) + "\n\nBlock devices:\n  7 loop\n259 blkext\n"
    )
    drv = root / "proc" / "driver" / "nvidia"
    drv.mkdir(parents=True)
    (drv / "version").write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.71.05\n")
    (drv / "params").write_text(
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\n"
        "DeviceFileMode: 438\n"
    )
    for minor in range(gpus):  # minors by probe order; the directories are named by PCI address
        gpu = drv / "gpus" / f"0000:{0x18 + 0x10 * minor:02x}:00.0"
        gpu.mkdir(parents=True)
        gpu.joinpath("information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t 0000:{0x18 + 0x10 * minor:02x}:00.0\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
    mig = drv / "capabilities" / "mig"
    mig.mkdir(parents=True)
    (mig / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    (mig / "monitor").write_text("DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    if mig_instance:
        gi = drv / "capabilities" / "gpu0" / "mig" / "gi1"
        gi.mkdir(parents=True)
        (gi / "access").write_text("DeviceFileMinor: 130\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    # nvidia and nvidia-uvm from modules-load.d; nvidia-modeset as `nvidia-modprobe -m` would load it
    for module in ["nvidia", "nvidia_modeset"] + (["nvidia_uvm"] if uvm_major is not None else []):
        (root / "sys" / "module" / module).mkdir(parents=True)
        (root / "sys" / "module" / module / "initstate").write_text("live\n")


def scratch_root(tmp: Path, script: str) -> Path:
    """A root to chroot into: /usr and /etc/alternatives are the machine's (bind-mounted), the rest is the
    host being modelled."""
    root = tmp / "root"
    for d in ("usr", "etc/alternatives", "dev/char", "etc/pve", "opt/standin", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        (root / link).symlink_to(f"usr/{link}")
    shutil.copy(STANDIN, root / "opt" / "standin" / "nvidia-modprobe")
    (root / "opt" / "nvidia-dev-nodes").write_text(script)
    (root / "opt" / "nvidia-dev-nodes").chmod(0o755)
    return root


def fresh_dev(root: Path) -> None:
    """/dev at boot: a new devtmpfs, with no /dev/nvidia* (the driver makes none); udev's /dev/char."""
    shutil.rmtree(root / "dev")
    (root / "dev" / "char").mkdir(parents=True)


def run_script(root: Path, pve_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run the scratch root's /opt/nvidia-dev-nodes as systemd runs ExecStart: as root, a minimal env."""
    pve_dir.mkdir(parents=True, exist_ok=True)
    inner = (
        f"mount --bind /usr {root}/usr && mount -o remount,bind,ro {root}/usr && "
        f"mount --bind /etc/alternatives {root}/etc/alternatives && "  # awk is an alternative (mawk)
        f"mount --bind {pve_dir} {root}/etc/pve && "
        f"exec chroot {root} /usr/bin/env -i PATH=/opt/standin:/usr/sbin:/usr/bin "
        "/bin/sh /opt/nvidia-dev-nodes"
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
        capture_output=True,
        text=True,
        timeout=120,
    )


def ct200_devices() -> list[str]:
    """CT 200's devN paths as role pve_ct sets them (tests/roles/test_pve_ct.py checks that list)."""
    return (
        [f"/dev/nvidia{i}" for i in range(GPUS)]
        + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        + ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    )


class Host:
    """The Proxmox host being modelled: the scratch root, its API double, CT 200 on autostart."""

    def __init__(self, tmp: Path, script: str) -> None:
        from proxmoxer import ProxmoxAPI

        self.root = scratch_root(tmp, script)
        self.pve = PveDouble(tmp / "pve", dev_root=self.root)
        state = default_state("pve1")
        state["storage"]["local"]["volumes"].append({"volid": TEMPLATE, "content": "vztmpl", "size": 1})
        self.pve.state_path.parent.mkdir(parents=True, exist_ok=True)
        self.pve.state_path.write_text(json.dumps(state))
        self.api = lambda: ProxmoxAPI(  # a new session after each reboot
            "127.0.0.1",
            port=self.pve.port,
            user="root@pam",
            password=self.pve.root_password,
            verify_ssl=str(self.pve.ca),
        )
        self.results: list[subprocess.CompletedProcess[str]] = []

    def units_before_guests(self) -> None:
        fresh_dev(self.root)
        self.results.append(run_script(self.root, self.pve.pve_dir))

    def reboot(self, uvm_major: int | None, caps_major: int) -> None:
        """Reboot: the driver loads again (with other dynamic majors), then the units before pve-guests."""

        def boot() -> None:
            write_kernel(self.root, uvm_major=uvm_major, caps_major=caps_major)
            self.units_before_guests()

        self.pve.reboot(boot)

    def create_ct(self, vmid: int, devices: list[str]) -> None:
        node = self.api().nodes("pve1")
        devn = {f"dev{i}": f"{path},gid=44,mode=0660" for i, path in enumerate(devices)}
        upid = node.lxc.post(vmid=vmid, ostemplate=TEMPLATE, rootfs="scratch:8", onboot=1, **devn)
        assert wait_task(node, upid)["exitstatus"] == "OK"

    def startall(self) -> dict[str, Any]:
        state = self.pve.state()
        return next(t for t in state["tasks"].values() if t["type"] == "startall")

    def ct_start_task(self, vmid: int) -> str:
        starts = [
            (t["pid"], u)
            for u, t in self.pve.state()["tasks"].items()
            if t["type"] == "vzstart" and t["id"] == str(vmid)
        ]
        return max(starts)[1]


@pytest.fixture
def installed(tmp_path: Path, rendered: Path) -> Iterator[Host]:
    """A host the role has installed: the unit ran once (uvm major 511, caps 237; a MIG instance exists),
    CT 200 created and started with all its GPUs, onboot=1."""
    host = Host(tmp_path, (rendered / "nvidia-dev-nodes").read_text())
    write_kernel(host.root, uvm_major=511, caps_major=237, mig_instance=True)
    host.units_before_guests()
    assert host.results[-1].returncode == 0, host.results[-1].stderr
    host.pve.start()
    try:
        host.create_ct(200, ct200_devices())
        node = host.api().nodes("pve1")
        assert wait_task(node, node.lxc(200).status.start.post())["exitstatus"] == "OK"
        yield host
    finally:
        host.pve.stop()


def test_the_unit_runs_before_pve_guests_as_a_oneshot(rendered: Path) -> None:
    unit = unit_file(rendered)
    assert "pve-guests.service" in unit["Unit"]["Before"].split()  # pve-manager's onboot start
    assert "pve-ha-lrm.service" in unit["Unit"]["Before"].split()  # HA-managed guests
    assert "systemd-modules-load.service" in unit["Unit"]["After"].split()
    assert (unit["Service"]["Type"], unit["Service"]["RemainAfterExit"]) == ("oneshot", "yes")
    assert "pve-guests.service" in unit["Install"]["WantedBy"].split()
    # ExecStart runs the script where role nvidia_open installs it
    tasks = yaml.safe_load((REPO / "roles" / "nvidia_open" / "tasks" / "system.yml").read_text())
    dest = next(
        t["ansible.builtin.template"]["dest"]
        for t in tasks
        if t.get("ansible.builtin.template", {}).get("src") == "nvidia-dev-nodes.sh.j2"
    )
    assert unit["Service"]["ExecStart"] == dest


def test_ct200_runs_after_a_reboot_with_its_gpu_nodes(installed: Host) -> None:
    host = installed
    # The next boot: nvidia-uvm and nvidia-caps get other majors (dynamic), /dev starts empty.
    host.reboot(uvm_major=509, caps_major=238)
    assert host.results[-1].returncode == 0, host.results[-1].stderr
    state = host.pve.state()
    assert state["cts"]["200"]["status"] == "running"
    assert host.startall()["log"] == ["Starting CT 200"]
    given = {d["path"]: (d["type"], d["major"], d["minor"]) for d in state["cts"]["200"]["passthrough"]}
    want = {f"/dev/nvidia{i}": ("c", 195, i) for i in range(GPUS)}
    want |= {
        "/dev/nvidiactl": ("c", 195, 255),
        "/dev/nvidia-uvm": ("c", 509, 0),
        "/dev/nvidia-uvm-tools": ("c", 509, 1),
        "/dev/nvidia-caps/nvidia-cap1": ("c", 238, 1),
        "/dev/nvidia-caps/nvidia-cap2": ("c", 238, 2),
    }
    assert given == want
    # made for the unprivileged CT: its root (host uid 100000) and group video (44 -> 100044), 0660
    assert {(d["uid"], d["gid"], d["mode"]) for d in state["cts"]["200"]["passthrough"]} == {
        (100000, 100044, 0o660)
    }
    assert os.readlink(host.root / "dev" / "char" / "195:255") == "../nvidiactl"


def test_without_nvidiactl_ct200_stays_stopped(installed: Host) -> None:
    """The unit as it was made no /dev/nvidiactl (nor the capability nodes): after the reboot pve-guests'
    start of CT 200 fails before lxc-start, naming a missing node, and CT 200 stays stopped."""
    host = installed
    (host.root / "opt" / "nvidia-dev-nodes").write_text(OLD_UNIT)
    host.reboot(uvm_major=509, caps_major=238)
    assert host.results[-1].returncode == 0  # it did not notice
    assert not (host.root / "dev" / "nvidiactl").exists()
    assert (host.root / "dev" / "nvidia7").is_char_device()
    assert host.pve.state()["cts"]["200"]["status"] == "stopped"
    # Perl's hash order picks which missing devN pve-container meets first: any is one the unit did not make.
    failed = {
        f"Device {path} does not exist"
        for path in ("/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2")
    }
    log = host.startall()["log"]
    assert log[0] == "Starting CT 200" and len(log) == 2, log
    assert log[1].removeprefix("Starting CT 200 failed: ") in failed, log
    node = host.api().nodes("pve1")
    assert node.tasks(host.ct_start_task(200)).status.get()["exitstatus"] in failed
    # a start by hand fails the same way until the nodes exist
    assert wait_task(node, node.lxc(200).status.start.post())["exitstatus"] in failed
    assert host.pve.state()["cts"]["200"]["status"] == "stopped"


def test_the_unit_fails_naming_each_missing_node(installed: Host) -> None:
    """nvidia-uvm did not load at this boot, and the MIG instance CT 201 was given is gone (instances do
    not survive a reboot): the unit fails and names those nodes; CT 200 and CT 201 stay stopped."""
    from proxmoxer.core import ResourceException

    host = installed
    node = host.api().nodes("pve1")
    with pytest.raises(ResourceException) as refused:  # Proxmox refuses a devN path that does not exist
        node.lxc.post(vmid=202, ostemplate=TEMPLATE, rootfs="scratch:8", dev0="/dev/nvidia9,gid=44")
    assert refused.value.status_code == 500 and "Device /dev/nvidia9 does not exist" in str(refused.value)
    host.create_ct(201, ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap130"])
    host.reboot(uvm_major=None, caps_major=238)
    res = host.results[-1]
    assert res.returncode == 1
    named = sorted(line for line in res.stderr.splitlines() if "CT " in line)  # the config's key order
    assert named == [
        f"nvidia-dev-nodes: {path} is missing: CT {vmid} (onboot) names it, and will not start"
        for path, vmid in [
            ("/dev/nvidia-caps/nvidia-cap130", 201),
            ("/dev/nvidia-uvm", 200),
            ("/dev/nvidia-uvm-tools", 200),
        ]
    ], res.stderr
    assert "nvidia-uvm is not in /proc/devices" in res.stderr, res.stderr
    assert (host.root / "dev" / "nvidiactl").is_char_device()
    state = host.pve.state()
    assert (state["cts"]["200"]["status"], state["cts"]["201"]["status"]) == ("stopped", "stopped")
    assert host.startall()["log"] == [
        "Starting CT 200",
        "Starting CT 200 failed: Device /dev/nvidia-uvm does not exist",
        "Starting CT 201",
        "Starting CT 201 failed: Device /dev/nvidia-caps/nvidia-cap130 does not exist",
    ]


def test_the_unit_fails_when_the_driver_did_not_load(tmp_path: Path, rendered: Path) -> None:
    root = scratch_root(tmp_path, (rendered / "nvidia-dev-nodes").read_text())
    write_kernel(root, uvm_major=511, caps_major=237)
    shutil.rmtree(root / "proc" / "driver")
    res = run_script(root, tmp_path / "etc-pve")
    assert res.returncode == 1
    assert "the nvidia module is not loaded (no /proc/driver/nvidia/version)" in res.stderr, res.stderr
    assert not list((root / "dev").glob("nvidia*"))
