"""Find values a user was meant to fill in and did not: placeholders left in the inventory.

`hostvars[inventory_hostname] | preflight_placeholders('REPLACE')` lists "variable[path]: value" for every
string under the host's inventory variables (group_vars, host_vars, extra vars) that is a placeholder:

- it contains the pattern (the example inventory's "REPLACE-with-...");
- the whole value is an ellipsis, bare or after a short prefix: "...", "hf_...", "sk-..." (the values of
  inventory/example/vault.example.yml);
- the whole value is zeros, with or without dashes, 16 characters or more: the all-zero UUID
  00000000-0000-0000-0000-000000000000 that stands for a Proxmox API token secret (Proxmox prints the
  secret as a random UUID, `pveum user token add`), or an all-zero digest.

A variable whose name says it holds a secret (a password, secret, token, API, access or private key) is
named without its value.
A variable that cannot be rendered (it names an undefined one, e.g. a vault key that is not set) is
skipped here: the role that reads it reports it with its own message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SKIP = re.compile(r"^(ansible_|group_names$|groups$|inventory_|omit$|playbook_dir$|hostvars$|environment$)")
_SECRET = re.compile(r"(_token\b|secret|password|api_key|access_key|private_key)", re.IGNORECASE)
# Whole values that are placeholders whatever the pattern.
_SHAPES = (
    re.compile(r"([A-Za-z0-9]{1,8}[_-])?(\.\.\.|\u2026)"),
    re.compile(r"0[0-]{15,}"),
)


def is_placeholder(value: str, pattern: re.Pattern[str]) -> bool:
    """True when `value` holds the pattern or is one of the placeholder shapes as a whole."""
    text = value.strip()
    return bool(pattern.search(value)) or any(shape.fullmatch(text) for shape in _SHAPES)


def _walk(value: Any, path: str, pattern: re.Pattern[str], out: list[str], depth: int = 0) -> None:
    if depth > 20:
        return
    if isinstance(value, str):
        if is_placeholder(value, pattern):
            shown = "(a placeholder; a secret's value is not shown)" if _SECRET.search(path) else value[:80]
            out.append(f"{path}: {shown}")
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
    """Every inventory value of one host that is still a placeholder, named by variable."""
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
