"""bin/lib/step.sh, the helper bin/lab runs its captured steps through: a step that fails shows its
output (its last lines) and names itself, so a failing lab step is never silent in CI's log."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_step(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source bin/lib/step.sh; {script}"],
        cwd=REPO, capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin", **env},
    )


def test_a_failing_step_prints_its_output_and_names_itself():
    # The lab's restart step made to fail on purpose: a command that prints, then exits 3.
    r = run_step(
        'step "restart of the finished run tiny (train.yml)" '
        "sh -c 'echo TASK [trainer_run : Start the run]; echo fatal: the unit failed >&2; exit 3' || exit $?"
    )
    assert r.returncode == 3
    assert "TASK [trainer_run : Start the run]" in r.stderr
    assert "fatal: the unit failed" in r.stderr
    assert 'FAILED step "restart of the finished run tiny (train.yml)" (exit 3)' in r.stderr


def test_a_failing_step_prints_only_its_last_lines():
    r = run_step("step many sh -c 'seq 1 100; exit 1' || exit 9", STEP_TAIL="5")
    assert r.returncode == 9
    lines = r.stderr.splitlines()
    assert lines[:5] == ["96", "97", "98", "99", "100"]
    assert len(lines) == 6


def test_a_passing_step_is_quiet_and_keeps_its_output_for_the_caller():
    r = run_step("step echo-it sh -c 'echo hello; echo warn >&2'; printf '%s' \"$step_out\"")
    assert r.returncode == 0
    assert r.stderr == ""
    assert r.stdout.splitlines() == ["hello", "warn"]


def test_bin_lab_captures_no_command_outside_a_step():
    """Every `x=$(command)` in bin/lab that runs a playbook, podman or ansible goes through step."""
    text = (REPO / "bin/lab").read_text()
    captured = [line for line in text.splitlines() if "=$(" in line and "<<<" not in line]
    # The one capture left is the refused deploy, which is expected to fail and prints its tail itself.
    tools = [line.strip() for line in captured if any(t in line for t in ("ansible", "podman"))]
    assert len(tools) == 1 and tools[0].startswith("if out=$(") and "action=deploy" in tools[0], tools
