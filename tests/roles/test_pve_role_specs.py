"""meta/argument_specs.yml of roles pve_ct, gpu_userspace and pyenv: every default in defaults/main.yml is
declared with the identical default, every declared option has a default there, and names carry the role
prefix. Also: the pins the pyenv role installs match pyproject's `gpu`/`model` extras."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = ["pve_ct", "gpu_userspace", "pyenv"]


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_match_defaults(role: str) -> None:
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    for name, value in defaults.items():
        assert name.startswith(f"{role}_"), name
        assert options[name]["default"] == value, name
        assert options[name].get("description"), name


def test_pyenv_gpu_pins_match_pyproject_extras() -> None:
    pins = dict(
        line.split("==")
        for line in (REPO / "files/pyenv/requirements-gpu.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    pyproject = (REPO / "pyproject.toml").read_text()
    for name in ("transformers", "flash-linear-attention", "triton", "wandb"):
        declared = re.findall(rf'"{re.escape(name)}==([^"]+)"', pyproject)
        assert declared and pins[name] == declared[0], (name, pins.get(name), declared)
    # torch's pin is requirements/torch.txt's, which role pyenv adds to these (tests/test_one_owner.py);
    # pyproject.toml repeats it as a dependency of `pip install -e .` (kept equal by tests/test_install.py).
    torch_pin = re.search(r"^torch==(\S+)", (REPO / "requirements/torch.txt").read_text(), re.M)
    assert "torch" not in pins and torch_pin
    assert re.findall(r'"torch==([^"]+)"', pyproject) == [torch_pin.group(1)]
