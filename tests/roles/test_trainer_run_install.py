"""Role trainer_run's install step (tasks/install.yml) on this machine: the trainer wheel goes into the node's
venv alone (--no-deps), and the venv must already hold its dependencies at their pins, which role pyenv
installs from its lock with hashes. A venv that lacks one is refused, naming it and the lock; nothing is
fetched from an index. The venv is a real one (python -m venv, with pip), the check is the real `pip check`,
and the wheel is a real (minimal) wheel whose METADATA carries the Requires-Dist lines pip reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the install step makes root-owned files (owner: root)"),
    pytest.mark.slow,  # a real venv with pip (about 15 s of CPU)
]


def _wheel(dest: Path, requires: list[str]) -> Path:
    """A minimal wheel of a package `trainer` 0.1.0 (PEP 427 layout: METADATA, WHEEL, RECORD)."""
    path = dest / "trainer-0.1.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: trainer\nVersion: 0.1.0\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        "trainer/__init__.py": "",
        "trainer-0.1.0.dist-info/METADATA": meta,
        "trainer-0.1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        record = "trainer-0.1.0.dist-info/RECORD"
        z.writestr(record, "".join(f"{n},,\n" for n in [*files, record]))
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("node") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path


def _install(tmp_path: Path, venv: Path, wheel: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "install.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: trainer_run\n        tasks_from: install.yml\n"
    )
    facts = {
        "_trainer_run_build": {"stdout": json.dumps({"wheel": str(wheel)})},
        "_trainer_run_digest": {"stdout": "0" * 64},
        "trainer_run_venv": str(venv),
        "trainer_run_base_dir": str(tmp_path / "base"),
        "trainer_run_uv_bin": str(tmp_path / "no-uv"),  # the venv's pip, as on a node without uv
        "node_uv_bin": str(tmp_path / "no-uv"),
    }
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", PIP_NO_INDEX="1",
               ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    return subprocess.run(
        [exe, str(play), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(facts), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_a_venv_without_the_wheels_dependencies_is_refused_naming_them(tmp_path: Path, venv: Path) -> None:
    wheel = _wheel(tmp_path, ["aiohttp==3.14.5"])
    r = _install(tmp_path, venv, wheel)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0, out[-2000:]
    assert f"the venv {venv} on localhost does not hold what the trainer wheel needs" in out, out[-2000:]
    assert "aiohttp" in out and "pyenv_requirements_lock" in out, out[-2000:]
    # Nothing was fetched from an index: the venv still lacks aiohttp, and no digest claims an install.
    assert not list(venv.glob("lib/python*/site-packages/aiohttp"))
    assert not (venv / ".trainer-wheel.sha256").exists()


def test_a_venv_that_holds_them_gets_the_wheel_alone(tmp_path: Path, venv: Path) -> None:
    pip = subprocess.run([str(venv / "bin/python"), "-m", "pip", "--version"], capture_output=True, text=True,
                         check=True)
    pin = "pip==" + pip.stdout.split()[1]  # a dependency the venv holds at exactly that version
    r = _install(tmp_path, venv, _wheel(tmp_path, [pin]))
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert (venv / ".trainer-wheel.sha256").read_text().strip() == "0" * 64
    show = subprocess.run([str(venv / "bin/python"), "-m", "pip", "show", "trainer"], capture_output=True,
                          text=True, check=False)
    assert "Version: 0.1.0" in show.stdout
