"""Filters of role trainer_run: the SGLang endpoints a generate run uses, as the SGLang nodes publish them.

`hostvars | trainer_run_sglang_endpoints(groups['sglang_nodes'])` returns the endpoints that role sglang
published on every host of the group as its local fact (/etc/ansible/facts.d/sglang.fact, read back as
`ansible_local.sglang`; role trainer_run gathers it from those hosts first). One source: nothing here
recomputes ports, counts or addresses from inventory defaults. `via_router=True` returns each host's
router instead of its instances; `hostvars | trainer_run_sglang_ca_pem(groups['sglang_nodes'])` the CA
certificates those hosts publish for their HTTPS endpoints, which the run then trusts alone. A host without
the fact, or an endpoint on a loopback address (which no
other host can reach), is refused with a message that says what to do.

The endpoints reach the trainer in the run's overrides file (YAML, the trainer's strict loader), never on the
unit's command line. `path | trainer_run_unit_path` guards the few paths that do stay in the unit (venv, run
config, overrides file, staging source and destination).

`hosts | trainer_run_placement(hostvars, inventory_hostname, port, rdzv_host, asked_nnodes)` makes one
training run of the hosts of the play: each host gets `train.placement` nnodes (the number of hosts),
node_rank (its index in inventory order) and rdzv_endpoint (the first host, torchrun's static rendezvous).
`trainer_run_nccl_env(ifname, ib_hca)` is the environment that pins NCCL (and gloo) to a network.
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


def sglang_ca_pem(hostvars: Mapping[str, Mapping[str, Any]], hosts: Sequence[str]) -> str:
    """The CA certificates (PEM) that the SGLang hosts serving HTTPS publish with their endpoints
    (`ansible_local.sglang.ca_pem`, written by role sglang: the CA it made or was given), each once, in host
    order: what the generator must trust for those endpoints. "" when no host serves HTTPS."""
    pems: list[str] = []
    for name in hosts:
        fact = (hostvars.get(name, {}).get("ansible_local") or {}).get("sglang")
        if not isinstance(fact, Mapping):
            continue
        urls = [str(u) for u in fact.get("endpoints") or []] + [str(fact.get("router") or "")]
        pem = str(fact.get("ca_pem") or "").strip()
        if pem and any(u.startswith("https://") for u in urls) and pem not in pems:
            pems.append(pem)
    return "".join(p + "\n" for p in pems)


class PlacementError(_Base):  # type: ignore[misc,valid-type]
    """Hosts that cannot form one training run."""


def _host_port(host: str, port: int) -> str:
    """host:port as torchrun's parse_rendezvous_endpoint reads it (an IPv6 address in brackets)."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def placement(
    hosts: Sequence[str],
    hostvars: Mapping[str, Mapping[str, Any]],
    me: str,
    port: int = 29500,
    rdzv_host: str = "",
    asked_nnodes: int = 1,
) -> dict[str, Any]:
    """The `train.placement` part of host `me`'s overrides when `hosts` (inventory order) train as one run.

    One host: {} (the run file's placement as is). N hosts: nnodes=N, node_rank=the index of `me`,
    rdzv_endpoint=`rdzv_host` (else the first host's ansible_host, else its name) and `port`: every node
    meets there (torchrun --rdzv-backend=static, node 0 hosts the store). A run file (with
    trainer_run_overrides) whose nnodes > 1 differs from the number of hosts is refused,
    naming both numbers."""
    hosts = list(hosts)
    n = len(hosts)
    asked = int(asked_nnodes)
    if asked > 1 and asked != n:
        raise PlacementError(
            f"the run asks train.placement.nnodes={asked} but the play has {n} host(s) ({', '.join(hosts)}): "
            f"run it on {asked} hosts (-e train_hosts=GROUP, or trainer_run_placement_hosts), "
            "or drop nnodes from the run file (the role sets it from the hosts)"
        )
    if n <= 1:
        return {}
    if me not in hosts:
        raise PlacementError(f"host {me} is not one of the run's hosts ({', '.join(hosts)})")
    if isinstance(port, bool) or not 1 <= int(port) <= 65535:
        raise PlacementError(f"trainer_run_rdzv_port={port!r} is not a TCP port (1..65535)")
    first = hosts[0]
    host = str(rdzv_host or hostvars.get(first, {}).get("ansible_host") or first)
    if _is_loopback(f"tcp://{_host_port(host, int(port))}"):
        raise PlacementError(
            f"the rendezvous address {host} (host {first}) is a loopback address, which the other "
            f"{n - 1} host(s) cannot reach: set ansible_host of {first} or trainer_run_rdzv_host"
        )
    return {"train": {"placement": {
        "nnodes": n,
        "node_rank": hosts.index(me),
        "rdzv_endpoint": _host_port(host, int(port)),
    }}}


def nccl_env(socket_ifname: str = "", ib_hca: str = "") -> dict[str, str]:
    """The unit's environment that pins the run's traffic: NCCL_SOCKET_IFNAME (NCCL's bootstrap and
    socket transport) and GLOO_SOCKET_IFNAME (gloo, the CPU backend) to `socket_ifname`, NCCL_IB_HCA to
    `ib_hca`; each only when set, else NCCL and gloo pick an interface themselves (NCCL docs, Environment
    Variables)."""
    env: dict[str, str] = {}
    for name, value in (("socket_ifname", socket_ifname), ("ib_hca", ib_hca)):
        if any(c.isspace() or c in "\"'\\$" for c in str(value)):
            raise PlacementError(f"trainer_run_nccl_{name}={value!r} has whitespace, quotes or $: "
                                 "give interface names like eth0, ^docker or mlx5_0,mlx5_1")
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = str(socket_ifname)
        # gloo takes exact interface names only (no NCCL "^" exclusion): "=eth0" (NCCL's exact match) is
        # "eth0" to gloo, and an exclusion list leaves gloo its own choice.
        if not str(socket_ifname).startswith("^"):
            env["GLOO_SOCKET_IFNAME"] = str(socket_ifname).lstrip("=")
    if ib_hca:
        env["NCCL_IB_HCA"] = str(ib_hca)
    return env


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "trainer_run_sglang_endpoints": sglang_endpoints,
            "trainer_run_sglang_ca_pem": sglang_ca_pem,
            "trainer_run_unit_path": unit_path,
            "trainer_run_placement": placement,
            "trainer_run_nccl_env": nccl_env,
        }
