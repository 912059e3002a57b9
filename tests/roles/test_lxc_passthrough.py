"""The passthrough lines role pve_ct renders (raw mode) given to a real LXC 5 container started here.

Fake NVIDIA device nodes are made with mknod in a temp dir (no GPU here), /proc/devices is a fake with
their majors, and role pve_ct's own `read_majors`/`render` produce the lines. The container (busybox
static rootfs, `lxc-start -P DIR`) must show the selected nodes with the right major:minor and not the
others. This host runs cgroup v1, where `lxc.cgroup2.*` keys do not apply: the cgroup2 lines are checked as
rendered, and the same rules, translated to `lxc.cgroup.devices.*`, are enforced for real (an allowed node
opens to ENXIO since no driver sits behind it; a node outside the rules gets EPERM)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pve_run import run_role

REPO = Path(__file__).resolve().parents[2]
PROC = (
    "Character devices:\n  1 mem\n195 nvidia-frontend\n235 nvidia-caps\n508 nvidia-uvm\n\n"
    "Block devices:\n  8 sd\n"
)
GPUS = [1, 3]


def _rawconf() -> Any:
    spec = importlib.util.spec_from_file_location(
        "pve_ct_rawconf", REPO / "roles/pve_ct/library/pve_ct_rawconf.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_nodes(dev: Path) -> None:
    (dev / "nvidia-caps").mkdir(parents=True)
    nodes = {f"nvidia{i}": (195, i) for i in range(4)}
    nodes |= {
        "nvidiactl": (195, 255),
        "nvidia-uvm": (508, 0),
        "nvidia-uvm-tools": (508, 1),
        "nvidia-caps/nvidia-cap1": (235, 1),
        "nvidia-caps/nvidia-cap2": (235, 2),
    }
    for name, (major, minor) in nodes.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def make_rootfs(root: Path) -> None:
    for d in ("bin", "dev", "proc", "sys", "tmp", "etc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    busybox = shutil.which("busybox") or "/bin/busybox"
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in ("sh", "ls", "grep", "stat", "cat"):
        (root / "bin" / applet).symlink_to("busybox")


def lxc_config(name: str, rootfs: Path, pve_lines: list[str], extra_mounts: list[str]) -> str:
    """A native LXC config carrying the role's lines ('key: value' in Proxmox's file, 'key = value' here),
    with cgroup2 device rules translated to this host's cgroup v1 keys."""
    base = [
        f"lxc.uts.name = {name}",
        f"lxc.rootfs.path = dir:{rootfs}",
        "lxc.net.0.type = empty",
        "lxc.init.cmd = /bin/busybox sleep 600",
        "lxc.mount.auto = proc:mixed sys:mixed",
        "lxc.autodev = 1",
        "lxc.apparmor.profile = unconfined",
        "lxc.cgroup.devices.deny = a",
        "lxc.cgroup.devices.allow = c 1:* rwm",
        "lxc.cgroup.devices.allow = c 5:* rwm",
        "lxc.cgroup.devices.allow = c 136:* rwm",
    ]
    for line in pve_lines:
        key, _, value = line.partition(": ")
        base.append(f"{key.replace('lxc.cgroup2.', 'lxc.cgroup.')} = {value}")
    return "\n".join(base + extra_mounts) + "\n"


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: it makes device nodes (mknod) and starts a privileged LXC container")
    if not shutil.which("lxc-start"):  # as root, bin/bootstrap installs them: a missing one is a broken setup
        pytest.fail("needs LXC: apt-get install lxc busybox-static (bin/bootstrap installs them)")
    base = tmp_path_factory.mktemp("lxc")
    dev, rootfs, lxcpath = base / "dev", base / "rootfs", base / "lxc"
    make_nodes(dev)
    make_rootfs(rootfs)
    mod = _rawconf()
    majors = mod.read_majors(PROC)
    pve_lines = mod.render(majors, GPUS, str(dev))
    name = f"pvect-{uuid.uuid4().hex[:8]}"
    (lxcpath / name).mkdir(parents=True)
    # nvidia2 is bind-mounted too, outside the role's rules: the cgroup must refuse it.
    extra = [f"lxc.mount.entry = {dev}/nvidia2 dev/nvidia2 none bind,optional,create=file"]
    (lxcpath / name / "config").write_text(lxc_config(name, rootfs, pve_lines, extra))
    common = ["-n", name, "-P", str(lxcpath)]
    subprocess.run(["lxc-start", *common, "-d", "-o", str(base / "lxc.log")], check=True, timeout=60)
    try:
        subprocess.run(["lxc-wait", *common, "-s", "RUNNING", "-t", "20"], check=True, timeout=30)

        def attach(script: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["lxc-attach", *common, "--", "/bin/busybox", "sh", "-c", script],
                capture_output=True,
                text=True,
                timeout=30,
            )

        yield {"attach": attach, "pve_lines": pve_lines, "dev": dev, "exec": ["lxc-attach", *common, "--"]}
    finally:
        subprocess.run(["lxc-stop", *common, "-k"], timeout=60, check=False)
        subprocess.run(["lxc-destroy", *common], timeout=60, check=False, capture_output=True)


def test_rendered_lines_are_cgroup2_with_majors_from_proc_devices(container: dict[str, Any]) -> None:
    allow = [line for line in container["pve_lines"] if line.startswith("lxc.cgroup2.devices.allow: ")]
    assert allow == [
        f"lxc.cgroup2.devices.allow: c {r} rwm" for r in ("195:1", "195:3", "195:255", "508:*", "235:*")
    ]
    assert not any(line.startswith("lxc.cgroup.") for line in container["pve_lines"])


def test_selected_nodes_are_inside_with_their_major_minor(container: dict[str, Any]) -> None:
    want = {
        "/dev/nvidia1": (195, 1),
        "/dev/nvidia3": (195, 3),
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm": (508, 0),
        "/dev/nvidia-uvm-tools": (508, 1),
        "/dev/nvidia-caps/nvidia-cap1": (235, 1),
        "/dev/nvidia-caps/nvidia-cap2": (235, 2),
    }
    res = container["attach"]("/bin/busybox stat -c '%n %t %T %F' " + " ".join(want))
    assert res.returncode == 0, res.stderr
    seen = {}
    for line in res.stdout.splitlines():
        path, major, minor, *kind = line.split()
        assert " ".join(kind) == "character special file", line
        seen[path] = (int(major, 16), int(minor, 16))
    assert seen == want


def test_unselected_gpu_is_absent(container: dict[str, Any]) -> None:
    res = container["attach"]("ls /dev")
    names = set(res.stdout.split())
    assert {"nvidia1", "nvidia3"} <= names
    assert "nvidia0" not in names


def test_device_rules_are_enforced(container: dict[str, Any]) -> None:
    """Allowed nodes open as far as the (absent) driver: ENXIO. nvidia2, mounted outside the rules: EPERM."""
    allowed = container["attach"]("cat /dev/nvidia1 2>&1; cat /dev/nvidia-uvm 2>&1; true")
    assert allowed.stdout.count("No such device or address") == 2, allowed.stdout
    denied = container["attach"]("cat /dev/nvidia2 2>&1; true")
    assert "Operation not permitted" in denied.stdout, denied.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("selected", "ok"), [([1, 2, 3], True), ([1, 3], False)])
def test_role_verify_asserts_exactly_the_selected_gpus(
    container: dict[str, Any], tmp_path: Path, selected: list[int], ok: bool
) -> None:
    """Role pve_ct's own check (verify.yml) run in this container through lxc-attach instead of pct exec.
    The container holds nvidia1, nvidia3 and the extra nvidia2 mount: the check passes only for exactly
    [1, 2, 3] and fails for a selection that misses one (an extra GPU) or names one it lacks."""
    res = run_role(
        tmp_path,
        {"pve_ct_exec_command": container["exec"], "_pve_ct_gpu_selected": selected, "pve_ct_vmid": 200},
        tasks_from="verify.yml",
    )
    if ok:
        assert res.rc == 0, res.failures
    else:
        assert res.rc != 0
        assert any(f"should see GPUs {selected}" in f and "nvidia2" in f for f in res.failures), res.failures
