"""Filters of role trainer_run: the SGLang endpoints a generate run uses, read from the inventory.

`hostvars | trainer_run_sglang_endpoints(groups['sglang_nodes'], inventory_hostname)` returns one
http:// base URL per SGLang instance of every host in the group, from the variables role sglang reads
(sglang_gpu_count, sglang_tp_size, sglang_base_port, sglang_host, sglang_router_*). When a host's GPU count
is not known from the inventory (sglang_gpu_count 0 = counted on the node) its router is used instead.
The address is the bind address when it is a specific one, else the host's ansible_host (or 127.0.0.1
when the SGLang host is the run's own host and binds loopback).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
ANY = {"0.0.0.0", "::", ""}


class EndpointError(ValueError):
    """An inventory that does not say where a generate run's endpoints are."""


def _address(hv: Mapping[str, Any], name: str, bind: str, this_host: str) -> str:
    if bind in LOOPBACK:
        if name != this_host:
            raise EndpointError(
                f"SGLang host {name} binds {bind}, which host {this_host} cannot reach: set sglang_host "
                f"(and sglang_api_key) for {name}, or set trainer_run_endpoints"
            )
        return "127.0.0.1"
    if bind in ANY:
        return str(hv.get("ansible_host") or name)
    return bind


def sglang_endpoints(
    hostvars: Mapping[str, Mapping[str, Any]], hosts: Sequence[str], this_host: str
) -> list[str]:
    urls: list[str] = []
    for name in hosts:
        hv = hostvars[name]
        gpus = int(hv.get("sglang_gpu_count", 0) or 0)
        tp = int(hv.get("sglang_tp_size", 1) or 1)
        if gpus > 0:
            host = _address(hv, name, str(hv.get("sglang_host", "127.0.0.1")), this_host)
            base = int(hv.get("sglang_base_port", 30000))
            urls += [f"http://{host}:{base + i}" for i in range(gpus // tp)]
        elif hv.get("sglang_router_enabled", True):
            host = _address(hv, name, str(hv.get("sglang_router_host", "127.0.0.1")), this_host)
            urls.append(f"http://{host}:{int(hv.get('sglang_router_port', 8000))}")
        else:
            raise EndpointError(
                f"SGLang host {name}: sglang_gpu_count is 0 (counted on the node) and the router is off; "
                "set sglang_gpu_count in the inventory or trainer_run_endpoints"
            )
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
