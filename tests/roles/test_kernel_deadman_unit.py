"""Role kernel's dead-man unit (templates/gpu-node-boot-deadman.service.j2), rendered as the role renders it
and read by the real systemd tools: it must be a unit systemd accepts, run on the new kernel only, be wanted
in emergency and rescue mode too, and reboot only when nobody stopped it in time. tests/boot/run.py shows it
working in a VM (scenario uefi-lvm-unreachable); this keeps its syntax and its rules checked in every run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from jinja2 import Environment, FileSystemLoader, StrictUndefined

REPO = Path(__file__).resolve().parents[2]
RELEASE = "6.14.11-gpunode"


def render(confirm_s: int = 600) -> str:
    env = Environment(loader=FileSystemLoader(REPO / "roles/kernel/templates"), undefined=StrictUndefined,
                      keep_trailing_newline=True)
    return env.get_template("gpu-node-boot-deadman.service.j2").render(
        _kernel_target=RELEASE, kernel_boot_confirm_s=confirm_s)


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, val = line.partition("=")
            out.setdefault(key.strip(), []).append(val.strip())
    return out


def test_it_runs_on_the_new_kernel_only_and_in_every_boot_mode():
    d = directives(render())
    # No comparison operator: a glob matched against `uname -r` (systemd.unit(5), ConditionKernelVersion=).
    assert d["ConditionKernelVersion"] == [RELEASE]
    assert d["DefaultDependencies"] == ["no"]
    assert set(d["WantedBy"][0].split()) == {"sysinit.target", "emergency.target", "rescue.target"}


def test_it_reboots_after_the_confirmation_time_and_not_when_stopped():
    d = directives(render(240))
    start = d["ExecStart"][0]
    # The sleep comes first and the reboot runs only when it ends: `systemctl stop` (the controller's
    # confirmation) kills the shell in its sleep, so nothing reboots.
    assert start.startswith("/bin/sh -c 'sleep 240; ")
    assert start.endswith("exec systemctl --force reboot'")
    assert "SuccessAction" not in d and "FailureAction" not in d  # a stop must not count as either


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_accepts_it(tmp_path):
    unit = tmp_path / "gpu-node-boot-deadman.service"
    unit.write_text(render())
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                       check=False)
    # verify also reports unrelated units of this machine; none of its lines may name ours.
    ours = [line for line in (r.stdout + r.stderr).splitlines() if unit.name in line]
    assert not ours, ours
