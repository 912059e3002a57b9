"""Testinfra in the molecule scenarios: each command goes straight to `podman exec` in the instance.

Molecule's testinfra verifier hands testinfra its Ansible inventory. Testinfra maps an inventory host to its
own backend only for the ssh, paramiko, local, docker and lxc connections
(testinfra.utils.ansible_runner.get_ansible_host); for `ansible_connection: podman` (or podman_pipelined, the
connection the scenarios use) it falls back to its
ansible backend, which runs every command and file check as an Ansible ad-hoc task: seconds each, minutes
for a scenario's checks. The instances are podman containers named after their inventory hosts (molecule's
podman driver), and `podman exec` runs as the container's root, as the converge does with become, so the
podman backend checks the same machine the same way.
"""

from __future__ import annotations

import pytest
import testinfra
from testinfra.host import Host


@pytest.fixture(scope="module")
def host(_testinfra_host: Host) -> Host:
    """The instance behind the inventory host testinfra parametrized this module with, over podman exec."""
    backend = _testinfra_host.backend
    if backend.NAME != "ansible":
        return _testinfra_host
    hostvars = backend.ansible_runner.get_variables(backend.host)
    if hostvars.get("ansible_connection") not in ("podman", "containers.podman.podman", "podman_pipelined"):
        return _testinfra_host
    return testinfra.get_host(f"podman://{backend.host}")
