#!/usr/bin/python
"""Ansible module: check Proxmox API access (token, TLS, node) and report the PVE version and templates."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_ct_api_info
short_description: Check access to the Proxmox VE API and read what role pve_ct needs to decide
description:
  - Authenticates with the API token over verified TLS, reads C(/version), checks that O(node) exists and
    lists the C(vztmpl) volumes of O(template_storage). Fails with a message naming the setting at fault
    (token, CA path, node).
options:
  api_host: {description: Proxmox API host., type: str, required: true}
  api_port: {description: Proxmox API port., type: int, default: 8006}
  api_user: {description: API user (user@realm)., type: str, required: true}
  api_token_id: {description: API token id., type: str, required: true}
  api_token_secret: {description: API token secret., type: str, required: true}
  validate_certs: {description: Verify TLS., type: bool, default: true}
  ca_path: {description: CA bundle that signed the API certificate., type: path}
  root_password: {description: root@pam password; when set, a ticket is requested early., type: str}
  node: {description: Proxmox node name., type: str, required: true}
  template_storage: {description: Storage whose templates are listed., type: str, required: true}
"""

RETURN = r"""
version: {description: PVE version (C(8.4.1))., type: str, returned: always}
root_ticket: {description: Whether a root@pam ticket was obtained (root_password accepted)., type: bool}
templates: {description: Volume ids of the templates on template_storage., type: list, returned: always}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules document first
from ansible.module_utils.pve_ct_api import API_ARGS, call, connect, connect_root  # noqa: E402


def main():
    args = dict(API_ARGS)
    args.update(node=dict(type="str", required=True), template_storage=dict(type="str", required=True))
    module = AnsibleModule(argument_spec=args, supports_check_mode=True)
    p = module.params
    api, version = connect(module)
    root_ticket = connect_root(module) is not None
    nodes = [n["node"] for n in call(module, "list nodes", api.nodes.get)]
    if p["node"] not in nodes:
        module.fail_json(
            msg="Proxmox node '{}' (pve_ct_node) is not in the cluster; nodes: {}".format(p["node"], nodes)
        )
    content = call(
        module,
        "list templates on storage '{}' (pve_ct_template_storage)".format(p["template_storage"]),
        api.nodes(p["node"]).storage(p["template_storage"]).content.get,
        content="vztmpl",
    )
    module.exit_json(
        changed=False,
        version=str(version.get("version")),
        templates=sorted(c["volid"] for c in content),
        root_ticket=root_ticket,
    )


if __name__ == "__main__":
    main()
