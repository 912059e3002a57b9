"""Role sglang on NVLink5 (HGX B200): how it tells such a system and the stand-ins molecule/sglang uses.

NVIDIA's driver container (github.com/NVIDIA/gpu-driver-container, ubuntu24.04/nvidia-driver) tells an
NVLink5 system by an InfiniBand device whose VPD names the NVLink switch management port
(`_assert_nvlink5_system`: grep SW_MNG /sys/class/infiniband/*/device/vpd) and waits for mlx5_core and
ib_umad before it starts Fabric Manager (`_ensure_nvlink5_prerequisites`). These tests run the role's own
detection command and the stand-in modprobe / Fabric Manager start script molecule/sglang installs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "tests/doubles/standins/fabricmanager"
NVLINK5_TASKS = ROOT / "roles/sglang/tasks/nvlink5.yml"


def detect(class_dir: Path) -> list[str]:
    """Run the role's detection command (nvlink5.yml) against an InfiniBand class directory."""
    task = yaml.safe_load(NVLINK5_TASKS.read_text())[0]
    argv = [
        str(class_dir) if a == "{{ sglang_infiniband_class_dir }}" else a
        for a in task["ansible.builtin.command"]["argv"]
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def ib_device(class_dir: Path, name: str, vpd: bytes) -> None:
    (class_dir / name / "device").mkdir(parents=True)
    (class_dir / name / "device" / "vpd").write_bytes(vpd)


def test_an_nvlink_switch_management_port_makes_an_nvlink5_system(tmp_path: Path) -> None:
    ib_device(tmp_path, "mlx5_0", b"\x82\x10ConnectX-7 NIC\x90\x0aPN:MCX75\x78")
    assert detect(tmp_path) == []
    ib_device(tmp_path, "mlx5_1", b"\x82\x10NVIDIA NVLink SW\x90\x0aPN:SW_MNG\x00\xff\x78")
    assert detect(tmp_path) == [f"{tmp_path}/mlx5_1/device/vpd"]


def test_no_infiniband_devices_is_no_nvlink5_system(tmp_path: Path) -> None:
    assert detect(tmp_path / "absent") == []


def modprobe(sys_module: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STANDIN_SYS_MODULE": str(sys_module)}
    return subprocess.run(
        [str(STANDINS / "standin-modprobe"), *args], capture_output=True, text=True, env=env
    )


def test_standin_modprobe_prints_insmod_only_when_it_loads(tmp_path: Path) -> None:
    dry = modprobe(tmp_path, "-v", "--dry-run", "ib_umad")
    assert dry.returncode == 0 and dry.stdout.startswith("insmod /lib/modules/")
    assert not (tmp_path / "ib_umad").exists()
    first = modprobe(tmp_path, "-v", "ib_umad")
    assert first.returncode == 0 and first.stdout.rstrip().endswith("/ib_umad.ko")
    assert (tmp_path / "ib_umad").is_dir()
    again = modprobe(tmp_path, "-v", "ib_umad")
    assert again.returncode == 0 and again.stdout == ""


def test_standin_modprobe_refuses_a_module_it_does_not_have(tmp_path: Path) -> None:
    out = modprobe(tmp_path, "-v", "no_such_module")
    assert out.returncode == 1
    assert "modprobe: FATAL: Module no_such_module not found" in out.stderr


def test_standin_fabric_manager_refuses_to_start_without_ib_umad(tmp_path: Path) -> None:
    env = {**os.environ, "STANDIN_SYS_MODULE": str(tmp_path / "module")}
    argv = [
        str(STANDINS / "nvidia-fabricmanager-start.sh"),
        "--mode",
        "start",
        "--fm-config-file",
        str(tmp_path / "fm.cfg"),
        "--fm-pid-file",
        str(tmp_path / "fm.pid"),
        "--nvlsm-config-file",
        str(tmp_path / "nvlsm.conf"),
        "--nvlsm-pid-file",
        str(tmp_path / "nvlsm.pid"),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert "kernel module ib_umad is not loaded" in out.stderr
    assert not (tmp_path / "nvlsm.pid").exists()
    # With ib_umad "loaded" it gets past that check (to the next one this machine may fail: ibstat, nvlsm).
    (tmp_path / "module" / "ib_umad").mkdir(parents=True)
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert "ib_umad" not in out.stderr
