"""Filters of role trainer_run: the SGLang endpoints a generate run uses, as the SGLang nodes publish them.

`hostvars | trainer_run_sglang_endpoints(groups['sglang_nodes'])` returns the endpoints that role sglang
published on every host of the group as its local fact (/etc/ansible/facts.d/sglang.fact, read back as
`ansible_local.sglang`; role trainer_run gathers it from those hosts first). One source: nothing here
recomputes ports, counts or addresses from inventory defaults. `via_router=True` returns each host's
router instead of its instances. A host without the fact, or an endpoint on a loopback address (which no
other host can reach), is refused with a message that says what to do.

The endpoints reach the trainer in the run's overrides file (YAML, the trainer's strict loader), never on the
unit's command line. `path | trainer_run_unit_path` guards the few paths that do stay in the unit (venv, run
config, overrides file, staging source and destination).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

try:  # Ansible shows an AnsibleFilterError's message as is; tests load this file without Ansible too
    from ansible.errors import AnsibleFilterError as _Base
except ImportError:  # pragma: no cover
    _Base = ValueError  # type: ignore[misc,assignment]


class EndpointError(_Base):  # type: ignore[misc,valid-type]
    """SGLang endpoints that a generate run cannot use."""


class UnitPathError(_Base):  # type: ignore[misc,valid-type]
    """A path that cannot go into a systemd unit line."""


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def sglang_endpoints(
    hostvars: Mapping[str, Mapping[str, Any]], hosts: Sequence[str], via_router: bool = False
) -> list[str]:
    urls: list[str] = []
    for name in hosts:
        fact = (hostvars[name].get("ansible_local") or {}).get("sglang")
        if not isinstance(fact, Mapping) or "endpoints" not in fact:
            raise EndpointError(
                f"SGLang host {name} publishes no endpoints (no ansible_local.sglang): deploy it first "
                "(ansible-playbook playbooks/sglang.yml), or set trainer_run_endpoints"
            )
        if via_router:
            if not fact.get("router"):
                raise EndpointError(f"SGLang host {name} runs no router (sglang_router_enabled is false)")
            found = [str(fact["router"])]
        else:
            found = [str(u) for u in fact["endpoints"]]
        if not found:
            raise EndpointError(f"SGLang host {name} publishes an empty endpoint list")
        loop = [u for u in found if _is_loopback(u)]
        if loop:
            raise EndpointError(
                f"SGLang host {name} publishes loopback endpoints {', '.join(loop)}, which the training node "
                f"cannot reach: set sglang_host to a reachable address (or 0.0.0.0) and sglang_api_key "
                f"for {name}, or sglang_advertise_host"
            )
        urls += found
    return urls


def unit_path(path: str) -> str:
    """A path as one word of a systemd unit line: `%` (a specifier) is written `%%`; whitespace, quotes,
    backslashes, `$` and control characters (which systemd would split, unquote or expand) are refused."""
    bad = sorted({c for c in str(path) if c.isspace() or c in "\"'\\$" or ord(c) < 32})
    if bad:
        raise UnitPathError(
            f"path {path!r} has {' '.join(repr(c) for c in bad)}, which a systemd unit line cannot carry "
            "as is: use a path without them"
        )
    return str(path).replace("%", "%%")


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "trainer_run_sglang_endpoints": sglang_endpoints,
            "trainer_run_unit_path": unit_path,
        }
