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
  - With O(privileges), reads the token's effective privileges on each path (C(GET /access/permissions),
    pve-access-control src/PVE/API2/AccessControl.pm) and fails, before anything is changed, naming every
    missing privilege and the two ways to grant them. A token made with privilege separation (the default
    of C(pveum user token add) and of the GUI) has only what ACLs grant the token itself.
options:
  api_host: {description: Proxmox API host., type: str, required: true}
  api_port: {description: Proxmox API port., type: int, default: 8006}
  api_user: {description: API user (user@realm)., type: str, required: true}
  api_token_id: {description: API token id., type: str, required: true}
  api_token_secret: {description: API token secret., type: str, required: true}
  validate_certs: {description: Verify TLS., type: bool, default: true}
  ca_path: {description: CA bundle that signed the API certificate., type: path}
  node: {description: Proxmox node name., type: str, required: true}
  template_storage: {description: Storage whose templates are listed., type: str, required: true}
  privileges:
    description: Privileges the token needs, as a list of C({path: ACL path, privs: [priv, ...]}).
    type: list
    elements: dict
"""

RETURN = r"""
version: {description: PVE version (C(8.4.1))., type: str, returned: always}
templates: {description: Volume ids of the templates on template_storage., type: list, returned: always}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules document first
from ansible.module_utils.pve_ct_api import API_ARGS, call, connect  # noqa: E402


def check_privileges(module, api, wanted):
    """Fail naming what the token lacks on each path (its effective privileges, as Proxmox computes them)."""
    token = "{}!{}".format(module.params["api_user"], module.params["api_token_id"])
    missing = {}
    for path, privs in sorted(wanted.items()):
        have = call(module, f"read the token's privileges on {path}", api.access.permissions.get, path=path)
        lacks = [x for x in privs if x not in (have or {}).get(path, {})]
        if lacks:
            missing[path] = lacks
    if missing:
        listing = "; ".join("{}: {}".format(k, ", ".join(v)) for k, v in missing.items())
        everything = sorted({x for privs in wanted.values() for x in privs})
        grants = "; ".join(
            f"pveum acl modify {path} --tokens '{token}' --roles PveCtToken" for path in sorted(missing)
        )
        module.fail_json(
            msg=(
                f"API token '{token}' lacks Proxmox privileges the role needs: {listing}. A token made with "
                "privilege separation (the default of `pveum user token add` and of the GUI, and the one to "
                "use) has only what ACLs grant the token itself. Grant exactly these: `pveum role add "
                f"PveCtToken --privs '{','.join(everything)}'` (once), then `{grants}`. (`--privsep 0` "
                "would give the token all of its user's privileges instead.)"
            ),
            missing=missing,
        )


def main():
    args = dict(API_ARGS)
    args.update(
        node=dict(type="str", required=True),
        template_storage=dict(type="str", required=True),
        privileges=dict(type="list", elements="dict", default=[]),
    )
    module = AnsibleModule(argument_spec=args, supports_check_mode=True)
    p = module.params
    api, version = connect(module)
    nodes = [n["node"] for n in call(module, "list nodes", api.nodes.get)]
    if p["node"] not in nodes:
        module.fail_json(
            msg="Proxmox node '{}' (pve_ct_node) is not in the cluster; nodes: {}".format(p["node"], nodes)
        )
    wanted = {}
    for item in p["privileges"] or []:
        wanted.setdefault(str(item["path"]), []).extend(
            x for x in item["privs"] if x not in wanted.get(item["path"], [])
        )
    check_privileges(module, api, wanted)
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
    )


if __name__ == "__main__":
    main()
