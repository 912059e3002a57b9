"""Each value the roles share has one owner, and no copy of it appears anywhere else.

Owners: roles/node/defaults/main.yml for the NVIDIA driver version, the uv binary, the training venv and the
workspace; requirements/torch.txt for the torch pin. Roles, inventories, playbooks (the lab's in lab/ too),
the stand-ins, the requirement files and the bootstrap read them (a role's own variable defaults to the
shared one). A copy is a literal of the value in any of those files, comment lines and Markdown excepted
(they may show an example). Run files (files/runs/) are the user's data on the node and the molecule
scenarios and tests hold their own expectations, so neither is scanned.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ROOT / "roles/node/defaults/main.yml"
TORCH = ROOT / "requirements/torch.txt"
SCANNED = ("roles/", "inventory/", "playbooks/", "lab/", "files/pyenv/", "requirements/", "bin/",
           "tests/doubles/", "site.yml", "train.yml", "pyproject.toml")
COMMENT = re.compile(r"^\s*(#|//|\*)")
# Files whose tool reads no other file and so must repeat a value: pip reads a package's dependencies from
# pyproject.toml alone. tests/test_install.py checks that each repeats its owner's value exactly.
MIRRORS = {"torch pin": ("pyproject.toml",)}


def _tracked() -> list[Path]:
    """The scanned files, but the locks (*.lock.txt): bin/lock generates them from the owners' pins, and
    tests/test_locks.py checks that they agree with them."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in out if f.startswith(SCANNED) and not f.endswith((".md", ".lock.txt"))
            and (ROOT / f).is_file()]


def _values() -> dict[str, tuple[re.Pattern[str], Path]]:
    d = yaml.safe_load(DEFAULTS.read_text())
    torch = re.search(r"^torch==(\S+)", TORCH.read_text(), re.M)
    assert torch, f"{TORCH}: no torch==VERSION line"
    # A path value is a copy when it stands alone as a path, not as the tail of another one
    # (/tank/workspace is a host path, not the workspace).
    def path(v: str) -> re.Pattern[str]:
        return re.compile(r"(?<![\w./}-])" + re.escape(v) + r"(?![\w-])")
    return {
        "node_driver_version": (
            re.compile(r"(?<![\d.])" + re.escape(d["node_driver_version"]) + r"(?![\d])"), DEFAULTS),
        "node_uv_bin": (path(d["node_uv_bin"]), DEFAULTS),
        "node_trainer_venv": (path(d["node_trainer_venv"]), DEFAULTS),
        "node_workspace": (path(d["node_workspace"]), DEFAULTS),
        "torch pin": (re.compile(r"\btorch(==|-)" + re.escape(torch.group(1))), TORCH),
    }


def test_owners_hold_the_values() -> None:
    values = _values()
    assert set(values) == {"node_driver_version", "node_uv_bin", "node_trainer_venv", "node_workspace",
                           "torch pin"}
    assert yaml.safe_load(DEFAULTS.read_text())["node_torch_requirement"].count("requirements/torch.txt") == 1


@pytest.mark.parametrize("name", ["node_driver_version", "node_uv_bin", "node_trainer_venv", "node_workspace",
                                  "torch pin"])
def test_no_copy_of_a_shared_value(name: str) -> None:
    pattern, owner = _values()[name]
    copies = []
    for f in _tracked():
        if f == owner or f.relative_to(ROOT).as_posix() in MIRRORS.get(name, ()):
            continue
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if pattern.search(line) and not COMMENT.match(line):
                copies.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not copies, (f"{name} is owned by {owner.relative_to(ROOT)}; read it from there instead of "
                        "copying it:\n" + "\n".join(copies))


def test_the_scan_sees_a_planted_copy(tmp_path: Path) -> None:
    """The patterns find a copy in the forms it takes (a quoted version, a path in a list, a pin)."""
    values = _values()
    samples = {
        "node_driver_version": 'nvidia_open_version: "595.71.05"',
        "node_uv_bin": "argv: [/usr/local/bin/uv, pip]",
        "node_trainer_venv": "pyenv_path: /opt/dflash/venv",
        "node_workspace": "sglang_model_dir: /workspace/models/x",
        "torch pin": "torch==" + re.search(r"torch==(\S+)", TORCH.read_text()).group(1) + "+cpu",  # type: ignore[union-attr]
    }
    for name, line in samples.items():
        assert values[name][0].search(line), (name, line)
    assert not values["node_workspace"][0].search("host_path: /tank/workspace")
    assert not values["node_workspace"][0].search('dest: "{{ _lab }}/workspace/prompts"')
    assert not values["node_driver_version"][0].search("1595.71.051")
