"""Filters of role trainer_run: the SGLang endpoints a generate run uses, as the SGLang nodes publish them.

`hostvars | trainer_run_sglang_endpoints(groups['sglang_nodes'])` returns the endpoints that role sglang
published on every host of the group as its local fact (/etc/ansible/facts.d/sglang.fact, read back as
`ansible_local.sglang`; role trainer_run gathers it from those hosts first). One source: nothing here
recomputes ports, counts or addresses from inventory defaults. `via_router=True` returns each host's
router instead of its instances. A host without the fact, or an endpoint on a loopback address (which no
other host can reach), is refused with a message that says what to do.
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


def endpoints_override(urls: Sequence[str]) -> str:
    """`--set` value for generate.endpoints: a YAML flow list without spaces or quotes (safe in ExecStart)."""
    for u in urls:
        if any(c in u for c in " ,[]'\"%$\\"):
            raise EndpointError(f"endpoint {u!r} has a character that cannot go into the unit's command line")
    return "generate.endpoints=[" + ",".join(urls) + "]"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "trainer_run_sglang_endpoints": sglang_endpoints,
            "trainer_run_endpoints_override": endpoints_override,
        }
