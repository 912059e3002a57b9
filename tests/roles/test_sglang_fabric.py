"""Role cuda_repo's Fabric Manager rule (roles sglang and nvidia_open) and the stand-in nvidia-smi's fabric.

The package names follow NVIDIA's driver container (github.com/NVIDIA/gpu-driver-container,
ubuntu24.04/precompiled/nvidia-driver: fabricmanager_install, nscq_install): from driver branch 580 on
`nvidia-fabricmanager` and `libnvidia-nscq`, before it `nvidia-fabricmanager-<branch>` and
`libnvidia-nscq-<branch>`, each pinned to the driver's version. molecule/sglang installs the branch-595
names from a stand-in apt repository and checks that a branch-570 driver asks apt for the suffixed names.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "roles/cuda_repo/filter_plugins/cuda_repo_fabric.py"
spec = importlib.util.spec_from_file_location("cuda_repo_fabric", PLUGIN)
sglang_fabric = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sglang_fabric)
NVIDIA_SMI = ROOT / "tests/doubles/standins/nvidia-smi"


def test_branch_595_uses_the_names_without_branch_pinned_to_the_driver_version() -> None:
    assert sglang_fabric.cuda_repo_fabric_packages("595.71.05") == [
        "nvidia-fabricmanager=595.71.05-*",
        "libnvidia-nscq=595.71.05-*",
    ]
    names = sglang_fabric.cuda_repo_fabric_package_names("595.71.05")
    assert names == ["nvidia-fabricmanager", "libnvidia-nscq"]


def test_branch_570_uses_the_names_with_the_branch() -> None:
    assert sglang_fabric.cuda_repo_fabric_packages("570.195.03") == [
        "nvidia-fabricmanager-570=570.195.03-*",
        "libnvidia-nscq-570=570.195.03-*",
    ]
    assert sglang_fabric.cuda_repo_fabric_package_names("570.195.03") == [
        "nvidia-fabricmanager-570",
        "libnvidia-nscq-570",
    ]


@pytest.mark.parametrize(
    ("version", "names"),
    [
        ("580.65.06", ["nvidia-fabricmanager", "libnvidia-nscq"]),  # the first unsuffixed branch
        ("575.64.05", ["nvidia-fabricmanager-575", "libnvidia-nscq-575"]),
        ("535.261.03", ["nvidia-fabricmanager-535", "libnvidia-nscq-535"]),
        ("610.10", ["nvidia-fabricmanager", "libnvidia-nscq"]),
    ],
)
def test_the_branch_is_the_first_field(version: str, names: list[str]) -> None:
    assert sglang_fabric.cuda_repo_fabric_package_names(version) == names
    assert sglang_fabric.driver_branch(version) == int(version.split(".")[0])


def test_the_pin_matches_the_repository_revisions_and_nothing_longer() -> None:
    from fnmatch import fnmatch

    (fm, _) = sglang_fabric.cuda_repo_fabric_packages("595.71.05")
    pattern = fm.split("=", 1)[1]
    assert fnmatch("595.71.05-1ubuntu1", pattern)
    assert fnmatch("595.71.05-1", pattern)
    assert not fnmatch("595.71.050-1", pattern)
    assert not fnmatch("595.71.04-1ubuntu1", pattern)


@pytest.mark.parametrize("bad", ["", "595", "595.71.05,580.95.05", "v595.71.05", None])
def test_anything_but_one_driver_version_is_refused(bad: object) -> None:
    with pytest.raises(sglang_fabric.DriverVersionError, match="one version as nvidia-smi reports it"):
        sglang_fabric.cuda_repo_fabric_packages(bad)


def _smi(cfg: Path) -> list[str]:
    r = subprocess.run(
        [sys.executable, str(NVIDIA_SMI), "--query-gpu=index,driver_version,fabric.state,fabric.status",
         "--format=csv,noheader"],
        env=dict(os.environ, NVIDIA_SMI_STANDIN_CONFIG=str(cfg)),
        capture_output=True, text=True, timeout=30, check=True,
    )
    return r.stdout.splitlines()


def test_standin_fabric_completes_only_once_both_daemons_run(tmp_path: Path) -> None:
    fm, sm = tmp_path / "nv-fabricmanager.pid", tmp_path / "nvlsm.pid"
    cfg = tmp_path / "smi.json"
    cfg.write_text(json.dumps({"driver_version": "595.71.05", "gpus": 2, "nvswitch": True,
                               "fabric_pid_files": [str(fm), str(sm)]}))
    assert _smi(cfg) == ["0, 595.71.05, In Progress, N/A", "1, 595.71.05, In Progress, N/A"]
    fm.write_text(f"{os.getpid()}\n")  # Fabric Manager runs, NVLSM not yet
    assert _smi(cfg)[0].endswith("In Progress, N/A")
    daemon = subprocess.Popen(["sleep", "60"])
    try:
        sm.write_text(f"{daemon.pid}\n")
        assert _smi(cfg) == ["0, 595.71.05, Completed, Success", "1, 595.71.05, Completed, Success"]
    finally:
        daemon.kill()
        daemon.wait()
    assert _smi(cfg)[0].endswith("In Progress, N/A"), "a pid file of a dead NVLSM is not a running fabric"


def test_standin_without_nvswitches_reports_no_fabric(tmp_path: Path) -> None:
    cfg = tmp_path / "smi.json"
    cfg.write_text(json.dumps({"driver_version": "595.71.05", "gpus": 1, "nvswitch": False}))
    assert _smi(cfg) == ["0, 595.71.05, N/A, N/A"]
