"""Every role documents its inputs: meta/argument_specs.yml exists and agrees with defaults/main.yml.

Defaults that drift from argument_specs are a known failure of large role collections (edpm-ansible):
this test keeps the two in step for every role in roles/.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

SECRET = re.compile(r"(_token$|secret|password|api_key|access_key)")

ROLES = sorted(p for p in Path("roles").iterdir() if (p / "tasks").is_dir())


def load(path: Path) -> dict:
    if not path.exists():
        return {}
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_has_argument_specs_matching_defaults(role: Path):
    specs = load(role / "meta" / "argument_specs.yml").get("argument_specs", {})
    assert "main" in specs, f"{role}: meta/argument_specs.yml has no `main` entry point"
    options = specs["main"].get("options", {})
    defaults = load(role / "defaults" / "main.yml")
    undocumented = sorted(set(defaults) - set(options))
    assert not undocumented, f"{role}: defaults not in argument_specs: {undocumented}"
    for name, value in defaults.items():
        spec = options[name]
        if "default" in spec:
            assert spec["default"] == value, (
                f"{role}: {name}: argument_specs default {spec['default']!r} != defaults/main.yml {value!r}"
            )
    for name, spec in options.items():
        assert name.startswith(f"{role.name}_") or name.startswith("_"), (
            f"{role}: variable {name} is not prefixed with the role name"
        )
        assert name in defaults or spec.get("required"), (
            f"{role}: option {name} has no default in defaults/main.yml and is not required"
        )
        if SECRET.search(name):
            assert spec.get("no_log") is True, f"{role}: secret {name} must be no_log in argument_specs"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_entry_point_states_the_defaults_of_defaults_main(role: Path):
    """An entry point besides `main` (gpu_userspace's `driver`, nvidia_open's `verify`) repeats some options;
    each repeated default must still be the one in defaults/main.yml, so the copies cannot drift apart."""
    specs = load(role / "meta" / "argument_specs.yml").get("argument_specs", {})
    defaults = load(role / "defaults" / "main.yml")
    for entry, spec in specs.items():
        for name, option in (spec.get("options") or {}).items():
            assert name in defaults or option.get("required"), f"{role}: {entry}: {name} has no default"
            if "default" in option and name in defaults:
                assert option["default"] == defaults[name], (
                    f"{role}: entry point {entry}: {name}: {option['default']!r}"
                    f" != defaults/main.yml {defaults[name]!r}"
                )


def test_there_are_roles():
    assert any(r.name == "preflight" for r in ROLES)
