"""Drive role pve_ct with the real `ansible-playbook` (subprocess) against the Proxmox API double.

The role's modules run locally with the real proxmoxer and the real community.proxmox modules; only the
Proxmox server is a double (tests/doubles/pve_api.py), because a real Proxmox VE cannot run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "doubles"))

from pve_api import default_state  # noqa: E402
from pve_api_fixture import PCT, PveDouble  # noqa: E402

__all__ = ["REPO", "PlayResult", "PveDouble", "default_state", "fake_gpu_dev", "run_role"]


@dataclass
class PlayResult:
    rc: int
    output: str
    stats: dict[str, Any]
    failures: list[str] = field(default_factory=list)
    changed_tasks: list[str] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return int(self.stats.get("changed", 0))


def fake_gpu_dev(directory: Path, gpus: int = 8) -> Path:
    """Empty files named like the NVIDIA device nodes (the role only looks them up by name)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in [f"nvidia{i}" for i in range(gpus)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        (directory / name).touch()
    return directory


def bind_source(directory: Path) -> Path:
    """A real directory standing for the host's /tank/workspace: the role runs on this machine as the
    Proxmox host, and Proxmox (and the double, started with --bind-root /) refuses a missing source. It is
    given to the unprivileged container's root (host uid 100000), as a site does for a writable bind mount."""
    if os.geteuid() != 0:
        pytest.skip("giving the bind mount source to the unprivileged CT's root (uid 100000) needs root")
    src = directory / "tank-workspace"
    src.mkdir(parents=True, exist_ok=True)
    os.chown(src, 100000, 100000)
    return src


def wait_task(node: Any, upid: str) -> dict[str, Any]:
    """The status of the double's task `upid` on `node` (a proxmoxer node) once it has stopped."""
    for _ in range(100):
        st = node.tasks(upid).status.get()
        if st["status"] == "stopped":
            return st
        time.sleep(0.1)
    raise AssertionError(f"task {upid} did not finish")


def _parse(stdout: str) -> tuple[dict[str, Any], list[str], list[str]]:
    start = stdout.find("{\n")  # the json callback's document; other callbacks may print around it
    data, _end = json.JSONDecoder().raw_decode(stdout[start:])
    stats = data.get("stats", {}).get("localhost", {})
    failures, changed = [], []
    for play in data.get("plays", []):
        for task in play.get("tasks", []):
            res = task.get("hosts", {}).get("localhost", {})
            name = task["task"]["name"].split(" : ", 1)[-1]  # drop the "role : " prefix
            if res.get("failed"):
                failures.append(f"{name}: {res.get('msg', '')}")
            if res.get("changed"):
                changed.append(name)
    return stats, failures, changed


def run_role(
    workdir: Path,
    role_vars: dict[str, Any],
    *,
    check: bool = False,
    role: str = "pve_ct",
    tasks_from: str = "",
) -> PlayResult:
    """Run `role` (or only its `tasks_from` file) once on localhost with `role_vars` as extra vars; parse
    the JSON callback's result."""
    workdir.mkdir(parents=True, exist_ok=True)
    play = workdir / "play.yml"
    head = f"---\n- name: Run {role}\n  hosts: localhost\n  gather_facts: false\n"
    if tasks_from:
        body = (
            f"  tasks:\n    - name: Include {role} {tasks_from}\n      ansible.builtin.include_role:\n"
            f"        name: {role}\n        tasks_from: {tasks_from}\n"
        )
    else:
        body = f"  roles:\n    - role: {role}\n"
    play.write_text(head + body)
    # This machine is the role's "Proxmox host": its `pct` is the stand-in (tests/doubles/standins/pct),
    # which sets the root-only keys through the double that PveDouble.start pointed it at.
    bindir = workdir / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "pct").exists():
        (bindir / "pct").symlink_to(PCT)
    varfile = workdir / "vars.json"
    varfile.write_text(json.dumps({"ansible_python_interpreter": sys.executable, **role_vars}))
    env = dict(
        os.environ,
        ANSIBLE_ROLES_PATH=str(REPO / "roles"),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_NOCOLOR="1",
        PATH=f"{bindir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    )
    pct_config = PveDouble.PCT_CONFIGS.get(role_vars.get("pve_ct_api_port", -1))
    if pct_config is not None:
        env["PCT_STANDIN_CONFIG"] = str(pct_config)
    cmd = [
        str(Path(sys.executable).with_name("ansible-playbook")),
        "-i",
        "localhost,",
        "-c",
        "local",
        str(play),
        "-e",
        f"@{varfile}",
    ]
    if check:
        cmd += ["--check", "--diff"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    try:
        stats, failures, changed = _parse(proc.stdout)
    except (ValueError, KeyError) as exc:
        raise AssertionError(
            f"ansible-playbook output is not JSON ({exc}):\n{proc.stdout}\n{proc.stderr}"
        ) from exc
    return PlayResult(proc.returncode, proc.stdout + proc.stderr, stats, failures, changed)
