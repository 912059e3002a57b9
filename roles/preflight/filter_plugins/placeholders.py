"""Find values a user was meant to fill in and did not: placeholders left in the inventory.

`hostvars[inventory_hostname] | preflight_placeholders('REPLACE')` lists "variable[path]: value" for every
string under the host's inventory variables (group_vars, host_vars, extra vars) that contains the pattern.
A variable that cannot be rendered (it names an undefined one, e.g. a vault key that is not set) is
skipped here: the role that reads it reports it with its own message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SKIP = re.compile(r"^(ansible_|group_names$|groups$|inventory_|omit$|playbook_dir$|hostvars$|environment$)")


def _walk(value: Any, path: str, pattern: re.Pattern[str], out: list[str], depth: int = 0) -> None:
    if depth > 20:
        return
    if isinstance(value, str):
        if pattern.search(value):
            out.append(f"{path}: {value[:80]}")
    elif isinstance(value, Mapping):
        for k in list(value.keys()):
            try:
                v = value[k]
            except Exception:
                continue
            _walk(v, f"{path}.{k}", pattern, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _walk(v, f"{path}[{i}]", pattern, out, depth + 1)


def preflight_placeholders(hostvars: Mapping[str, Any], pattern: str = "REPLACE") -> list[str]:
    """Every inventory value of one host that still holds the placeholder pattern, named by variable."""
    rx = re.compile(pattern)
    out: list[str] = []
    for name in sorted(hostvars.keys()):
        if _SKIP.match(name):
            continue
        try:
            value = hostvars[name]
        except Exception:
            continue
        _walk(value, name, rx, out)
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"preflight_placeholders": preflight_placeholders}
