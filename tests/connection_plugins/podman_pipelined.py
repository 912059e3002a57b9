"""Ansible connection to a podman container that pipelines modules: the lab's and molecule's connection.

containers.podman.podman runs each module in three or four `podman exec` calls (make a temporary directory,
copy the module in, run it, remove the directory), because it never attaches stdin (`podman exec` without
`-i`), so it cannot pipeline. This connection is that plugin with one change: a command that has input runs
as `podman exec -i`, so a module goes to the container's Python on stdin in one call, as Ansible's ssh
connection does with `pipelining = True` on a real host. Files (copy, template) still go in through the
container's mounted root filesystem, or `podman cp` when a remote user is set, exactly as with the
collection's plugin.
"""

from __future__ import annotations

import shlex

from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import Connection as _PodmanConnection

DOCUMENTATION = """
    name: podman_pipelined
    short_description: Run modules in an existing podman container, pipelined through podman exec -i
    description:
        - containers.podman.podman with module pipelining, for the lab's and molecule's test containers.
    options:
      remote_addr:
        description: The name or ID of the container.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description: The user that runs commands inside the container (podman exec --user).
        ini:
          - section: defaults
            key: remote_user
        env:
          - name: ANSIBLE_REMOTE_USER
        vars:
          - name: ansible_user
      podman_extra_args:
        description: Extra arguments to pass to the podman command line.
        default: ''
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description: The podman executable.
        default: podman
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
      pipelining:
        description: Send modules to the container's Python on stdin instead of copying them in first.
        type: boolean
        default: true
        vars:
          - name: ansible_pipelining
        env:
          - name: ANSIBLE_PIPELINING
"""


class Connection(_PodmanConnection):
    """containers.podman.podman, with stdin attached when there is input, hence pipelining."""

    transport = "podman_pipelined"
    has_pipelining = True

    @ensure_connect
    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = False
    ) -> tuple[int, bytes, bytes]:
        # The base class of the collection's plugin checks the command and records it; skip only its own body.
        super(_PodmanConnection, self).exec_command(cmd, in_data=in_data, sudoable=sudoable)
        args = shlex.split(to_native(cmd, errors="surrogate_or_strict"))
        podman_exec = ["exec", "-i"] if in_data is not None else ["exec"]
        if self.user:
            podman_exec += ["--user", self.user]
        return self._podman(podman_exec, args, in_data)
