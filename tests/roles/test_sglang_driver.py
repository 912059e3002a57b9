"""Role sglang's driver check on the B200 node: a floor, and an exact version only when one is pinned.

A real ansible-playbook run of the role's checks (tasks_from inputs.yml, gpus.yml and driver_check.yml,
on localhost) against the stand-in nvidia-smi (tests/doubles/standins/nvidia-smi) reporting 3 x B200 at a
given driver version.
The B200 node's driver is its own, not the Proxmox host's: nothing here sets nvidia_open_version.
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
NVIDIA_SMI = ROOT / "tests/doubles/standins/nvidia-smi"

_PLAY = """\
- name: Run role sglang's checks for each stand-in driver
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    sglang_api_key: k
    results: {{}}
  tasks:
    - name: Run the checks
      ansible.builtin.include_tasks: case.yml
      loop: {cases}
      loop_control:
        loop_var: case

    - name: Write the results
      ansible.builtin.copy:
        dest: {out}
        content: "{{{{ results | to_json }}}}"
        mode: "0644"
"""

_CASE = """\
- name: Run the role's checks
  block:
    - name: Check the inputs, read the GPUs, check the driver
      ansible.builtin.include_role:
        name: sglang
        tasks_from: "{{ phase }}"
      vars:
        sglang_nvidia_smi: "{{ case.smi }}"
        sglang_driver_version: "{{ case.pin }}"
      loop: [inputs.yml, gpus.yml, driver_check.yml]
      loop_control:
        loop_var: phase

    - name: Record a pass
      ansible.builtin.set_fact:
        results: "{{ results | combine({case.name: 'passed: ' ~ _sglang_driver_version}) }}"
  rescue:
    - name: Record the refusal
      ansible.builtin.set_fact:
        results: "{{ results | combine({case.name: ansible_failed_result.msg}) }}"
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("sglang-driver")
    cases = []
    for name, version, pin in [
        ("below", "570.195.03", ""),
        ("floor", "580.65.06", ""),
        ("above", "595.71.05", ""),
        ("pinned", "595.71.05", "595.71.05"),
        ("mismatch", "595.71.05", "595.58.03"),
    ]:
        cfg = tmp / f"{name}.json"
        cfg.write_text(json.dumps({"driver_version": version, "name": "NVIDIA B200", "gpus": 3}))
        smi = tmp / f"smi-{name}"
        smi.write_text(
            f'#!/bin/sh\nNVIDIA_SMI_STANDIN_CONFIG={cfg} exec {sys.executable} {NVIDIA_SMI} "$@"\n'
        )
        smi.chmod(0o755)
        cases.append({"name": name, "smi": str(smi), "pin": pin})
    out = tmp / "results.json"
    (tmp / "play.yml").write_text(_PLAY.format(cases=json.dumps(cases), out=out))
    (tmp / "case.yml").write_text(_CASE)
    env = dict(
        os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_ROLES_PATH=str(ROOT / "roles")
    )
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    extra = json.dumps({"ansible_python_interpreter": sys.executable})
    r = subprocess.run(
        [exe, "-i", "localhost,", str(tmp / "play.yml"), "-e", extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return json.loads(out.read_text())


def test_a_driver_below_the_floor_is_refused_naming_both_versions(results: dict[str, str]) -> None:
    msg = " ".join(results["below"].split())
    assert "has NVIDIA driver 570.195.03, below sglang_driver_min_version=580.65.06" in msg, msg


def test_the_floor_and_above_pass_without_a_pin_or_the_hosts_driver_version(results: dict[str, str]) -> None:
    assert results["floor"] == "passed: 580.65.06"
    assert results["above"] == "passed: 595.71.05"


def test_an_explicit_pin_is_checked_only_when_set(results: dict[str, str]) -> None:
    assert results["pinned"] == "passed: 595.71.05"
    msg = " ".join(results["mismatch"].split())
    assert "has NVIDIA driver 595.71.05, but sglang_driver_version pins 595.58.03" in msg, msg
