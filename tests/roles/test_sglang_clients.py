"""Who may connect to the SGLang instances and the router: systemd's per-unit IP firewall.

The role renders `IPAddressDeny=any` and `IPAddressAllow=localhost <this node's addresses> <clients>` into the
instance and router units (systemd.resource-control(5): the kernel drops other peers' packets to and from
the unit's sockets). The clients default to the GPU containers' addresses, where the generator runs. A host
name is refused by the role's inputs before anything is rendered: systemd takes no host names there, and a
unit with one fails to load. The real role templates are rendered by the real ansible-playbook on this
machine (the enforcement itself is the kernel's: cgroup BPF, which the podman containers of molecule and
the lab do not grant, so molecule checks the loaded unit's properties instead).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PLAY = """
- name: Render the SGLang units
  hosts: node
  gather_facts: true
  tasks:
    - name: Check the role's inputs and expose its variables
      ansible.builtin.include_role:
        name: sglang
        tasks_from: inputs
        public: true
    - name: Render the units
      ansible.builtin.template:
        src: "{{ item }}"
        dest: "{{ out }}/{{ item | basename | regex_replace('\\\\.j2$', '') }}"
        mode: "0644"
      loop:
        - %(root)s/roles/sglang/templates/sglang@.service.j2
        - %(root)s/roles/sglang/templates/sglang-router.service.j2
      vars:
        _sglang_instances: [0, 1]
    - name: Write the hosts the role puts in URLs
      ansible.builtin.copy:
        content: "{{ {'probe': _sglang_probe_url_host, 'router_probe': _sglang_router_probe_url_host,
          'advertise': _sglang_advertise_url_host,
          'router_advertise': _sglang_router_advertise_url_host} | to_json }}"
        dest: "{{ out }}/url_hosts.json"
        mode: "0644"
"""

INVENTORY = """
all:
  children:
    gpu_containers:
      hosts:
        ct200: {ansible_host: 10.0.0.200}
        ct201: {ansible_connection: community.proxmox.proxmox_pct_remote}
    sglang_nodes:
      hosts:
        node: {ansible_connection: local, ansible_python_interpreter: "%(python)s"}
"""


def _render(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "play.yml").write_text(PLAY % {"root": ROOT})
    (tmp_path / "hosts.yml").write_text(INVENTORY % {"python": sys.executable})
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_ROLES_PATH"] = str(ROOT / "roles")
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    args = ["-e", f"out={out}", "-e", "sglang_api_key=k", "-e", "sglang_model_revision=" + "0" * 40, *extra]
    return subprocess.run(
        [exe, str(tmp_path / "play.yml"), "-i", str(tmp_path / "hosts.yml"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def _lines(path: Path, key: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith(key)]


def test_units_admit_loopback_this_node_and_the_gpu_containers_only(tmp_path: Path) -> None:
    r = _render(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    for unit in ("sglang@.service", "sglang-router.service"):
        path = tmp_path / "out" / unit
        assert _lines(path, "IPAddressDeny=") == ["IPAddressDeny=any"], unit
        (allow,) = _lines(path, "IPAddressAllow=")
        words = allow.removeprefix("IPAddressAllow=").split()
        assert words[0] == "localhost"
        # CT 200 by its address; ct201 has none (reached through pct): nothing to admit, and no host name
        assert "10.0.0.200" in words and "ct201" not in words
        assert len(words) == len(set(words)) and len(words) >= 3, words  # + this machine's own addresses


def test_any_turns_the_filter_off(tmp_path: Path) -> None:
    r = _render(tmp_path, "-e", json.dumps({"sglang_allowed_clients": ["any"]}))
    assert r.returncode == 0, r.stdout[-3000:]
    assert _lines(tmp_path / "out" / "sglang@.service", "IPAddress") == []


def test_a_host_name_is_refused_before_anything_is_rendered(tmp_path: Path) -> None:
    clients = ["10.0.0.0/24", "fd00::/64", "ct200.lan"]
    r = _render(tmp_path, "-e", json.dumps({"sglang_allowed_clients": clients}))
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0
    assert "sglang_allowed_clients has ct200.lan, which is not an address or prefix" in out, out[-2000:]
    assert not (tmp_path / "out" / "sglang@.service").exists()


def test_an_ipv6_bind_address_goes_in_brackets_in_every_url(tmp_path: Path) -> None:
    """The probes, the router's worker URLs and the published endpoints put an IPv6 literal in brackets
    (RFC 3986, section 3.2.2); the bind flags take it bare, as SGLang's and the router's --host do."""
    r = _render(tmp_path, "-e", "sglang_host=fd00::5", "-e", "sglang_router_host=fd00::5")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    hosts = json.loads((tmp_path / "out" / "url_hosts.json").read_text())
    assert hosts == dict.fromkeys(["probe", "router_probe", "advertise", "router_advertise"], "[fd00::5]")
    router = (tmp_path / "out" / "sglang-router.service").read_text()
    assert "--host fd00::5 " in router
    assert "--worker-urls https://[fd00::5]:30000 https://[fd00::5]:30001" in router  # TLS on by default
    # IPv4 stays as it is
    r = _render(tmp_path, "-e", "sglang_host=10.0.0.9")
    assert r.returncode == 0, r.stdout[-3000:]
    assert json.loads((tmp_path / "out" / "url_hosts.json").read_text())["advertise"] == "10.0.0.9"
