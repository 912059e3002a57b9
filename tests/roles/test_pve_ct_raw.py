"""Role pve_ct in raw passthrough mode (lxc.cgroup2 + lxc.mount.entry lines in /etc/pve/lxc/VMID.conf),
through the real ansible-playbook against the Proxmox API double (a real Proxmox VE cannot run here; the
double writes lxc/VMID.conf into a temp dir as pmxcfs would, keeping raw lxc.* lines and [snapshot]
sections). /proc/devices is a file written by the test, so the majors can change as after a driver
update."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pve_run import REPO, PveDouble, fake_gpu_dev, run_role

PROC = """Character devices:
  1 mem
  4 tty
{front:>3} nvidia-frontend
{caps:>3} nvidia-caps
{uvm:>3} nvidia-uvm

Block devices:
  8 sd
259 blkext
"""


def proc_devices(path: Path, front: int = 195, uvm: int = 508, caps: int = 235, drop: str = "") -> Path:
    text = PROC.format(front=front, uvm=uvm, caps=caps)
    path.write_text(
        "\n".join(line for line in text.splitlines() if not drop or not line.endswith(drop)) + "\n"
    )
    return path


def expected_lines(dev: Path, gpus: list[int], uvm: int, caps: int) -> list[str]:
    allow = [f"c 195:{i} rwm" for i in gpus] + ["c 195:255 rwm", f"c {uvm}:* rwm", f"c {caps}:* rwm"]
    nodes = [f"nvidia{i}" for i in gpus] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    return (
        [f"lxc.cgroup2.devices.allow: {a}" for a in allow]
        + [f"lxc.mount.entry: {dev}/{n} dev/{n} none bind,optional,create=file" for n in nodes]
        + [f"lxc.mount.entry: {dev}/nvidia-caps dev/nvidia-caps none bind,optional,create=dir"]
    )


def main_section(conf: Path) -> list[str]:
    lines = conf.read_text().splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    main = lines[:cut]
    while main and not main[-1]:
        main.pop()
    return main


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("raw")
    pve = PveDouble(base / "pve")
    pve.start()
    dev = fake_gpu_dev(base / "dev")
    try:
        yield {"pve": pve, "dev": dev, "base": base, "proc": base / "proc-devices"}
    finally:
        pve.stop()


def raw_vars(env: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        **env["pve"].role_vars(),
        "pve_ct_vmid": 201,
        "pve_ct_rootfs_storage": "scratch",
        "pve_ct_passthrough_mode": "raw",
        "pve_ct_gpus": [0, 1],
        "pve_ct_host_dev_dir": str(env["dev"]),
        "pve_ct_proc_devices": str(env["proc"]),
        "pve_ct_state_dir": str(env["base"] / "state"),
        "pve_ct_verify_gpus": False,
        **extra,
    }


def writes(pve: PveDouble) -> list[str]:
    """Requests that change something (a root@pam ticket login changes nothing)."""
    return [
        f"{r['method']} {r['path'].rsplit('/', 2)[-2]}/{r['path'].rsplit('/', 1)[-1]}"
        for r in pve.requests()
        if r["method"] != "GET" and r["path"] != "/api2/json/access/ticket"
    ]


@pytest.mark.slow
def test_raw_lines_placed_before_snapshots_and_replaced_after_a_driver_update(env: dict[str, Any]) -> None:
    pve, dev = env["pve"], env["dev"]
    conf = pve.pve_dir / "lxc" / "201.conf"
    proc_devices(env["proc"], uvm=508, caps=235)
    first = run_role(env["base"] / "run", raw_vars(env))
    assert first.rc == 0, first.failures
    assert main_section(conf)[-len(expected_lines(dev, [0, 1], 508, 235)) :] == expected_lines(
        dev, [0, 1], 508, 235
    )
    assert not any(k.startswith("dev") for k in pve.state()["cts"]["201"]["config"])
    assert writes(pve)[-2:] == ["POST status/stop", "POST status/start"]  # restarted to apply the lines

    snapshot = "[before-upgrade]\ncores: 8\nlxc.cgroup2.devices.allow: c 508:* rwm\n"
    conf.write_text(conf.read_text() + "\n" + snapshot)  # as `pct snapshot` appends a section
    pve.clear_log()
    second = run_role(env["base"] / "run", raw_vars(env))
    assert second.rc == 0, second.failures
    assert second.changed == 0, second.changed_tasks
    assert writes(pve) == []

    proc_devices(env["proc"], uvm=510, caps=236)  # driver update: new majors
    pve.clear_log()
    third = run_role(env["base"] / "run", raw_vars(env, pve_ct_cores=16))  # and an API change (PUT)
    assert third.rc == 0, third.failures
    main = main_section(conf)
    assert main[-len(expected_lines(dev, [0, 1], 510, 236)) :] == expected_lines(dev, [0, 1], 510, 236)
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" not in main
    assert "lxc.cgroup2.devices.allow: c 235:* rwm" not in main
    assert "cores: 16" in main
    assert conf.read_text().endswith("\n" + snapshot)  # the snapshot is kept as it was taken
    assert "POST status/stop" in writes(pve) and writes(pve)[-1] == "POST status/start"


@pytest.mark.slow
def test_missing_uvm_major_refuses_to_write(env: dict[str, Any]) -> None:
    conf = env["pve"].pve_dir / "lxc" / "202.conf"
    proc_devices(env["proc"], drop="nvidia-uvm")
    res = run_role(env["base"] / "refuse", raw_vars(env, pve_ct_vmid=202, pve_ct_hostname="ct202"))
    assert res.rc != 0
    assert any("refusing to write" in f and "'nvidia-uvm'" in f for f in res.failures), res.failures
    assert conf.exists() and "lxc.cgroup2" not in conf.read_text()


def _rawconf_module() -> Any:
    path = REPO / "roles" / "pve_ct" / "library" / "pve_ct_rawconf.py"
    spec = importlib.util.spec_from_file_location("pve_ct_rawconf", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_render_reads_majors_and_never_hardcodes_them(tmp_path: Path) -> None:
    mod = _rawconf_module()
    majors = mod.read_majors(proc_devices(tmp_path / "p", front=195, uvm=491, caps=240).read_text())
    assert majors["nvidia-uvm"] == 491 and majors["nvidia-caps"] == 240
    assert "sd" not in majors  # block devices are not character devices
    lines = mod.render(majors, [3], "/dev")
    assert (
        "lxc.cgroup2.devices.allow: c 491:* rwm" in lines
        and "lxc.cgroup2.devices.allow: c 240:* rwm" in lines
    )
    assert "lxc.cgroup2.devices.allow: c 195:3 rwm" in lines and "c 195:0 rwm" not in " ".join(lines)
    with pytest.raises(KeyError, match="nvidia-caps"):
        mod.render({k: v for k, v in majors.items() if k != "nvidia-caps"}, [0], "/dev")
    assert mod.render({k: v for k, v in majors.items() if k != "nvidia-caps"}, [0], "/dev", caps=False)


def test_place_puts_lines_before_the_first_section_and_keeps_user_lines() -> None:
    mod = _rawconf_module()
    text = (
        "arch: amd64\nlxc.apparmor.profile: unconfined\n\n"
        "[snap]\nlxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind\n"
    )
    out = mod.place(
        text, ["lxc.cgroup2.devices.allow: c 1:2 rwm"], previous=["lxc.cgroup2.devices.allow: c 9:9 rwm"]
    )
    assert out.split("\n[snap]")[0].splitlines() == [
        "arch: amd64",
        "lxc.apparmor.profile: unconfined",
        "lxc.cgroup2.devices.allow: c 1:2 rwm",
    ]
    assert out.endswith("[snap]\nlxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind\n")
    assert mod.place(out, ["lxc.cgroup2.devices.allow: c 1:2 rwm"]) == out  # stable
    assert (
        "c 1:2"
        not in mod.place(out, None, previous=["lxc.cgroup2.devices.allow: c 1:2 rwm"]).split("[snap]")[0]
    )


@pytest.mark.slow
def test_check_mode_on_a_new_container_plans_without_writing(env: dict[str, Any]) -> None:
    pve = env["pve"]
    proc_devices(env["proc"])
    pve.clear_log()
    res = run_role(env["base"] / "dry", raw_vars(env, pve_ct_vmid=203, pve_ct_hostname="ct203"), check=True)
    assert res.rc == 0, res.failures
    assert "Create or converge the container and bring it to its run state" in res.changed_tasks
    assert "Write the passthrough lines into the container config" in res.changed_tasks
    assert writes(pve) == []
    assert "203" not in pve.state()["cts"]
    assert not (pve.pve_dir / "lxc" / "203.conf").exists()
