#!/usr/bin/python
"""Ansible module: create or converge one Proxmox LXC container through the API (proxmoxer)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_ct_container
short_description: Create or converge a Proxmox VE LXC container, with device passthrough, through the API
description:
  - Creates container O(vmid) from O(ostemplate) when it does not exist; otherwise converges its config
    (cores, memory, swap, net0, features, onboot, bind mounts C(mpN), passthrough devices C(devN),
    rootfs growth)
    with one C(PUT /config), and starts, stops or restarts it.
  - Written for this repository because C(community.proxmox.proxmox) has no check mode, no diff and no
    C(devN) entries. Check mode reports what would change without calling any write endpoint.
  - Create-only settings (C(unprivileged), C(ssh-public-keys), the rootfs storage) are applied at creation;
    a different C(unprivileged) on an existing container is an error (it needs a re-create).
  - Auth follows pve-container's permission rules (src/PVE/LXC.pm check_ct_modify_config_perm). The API
    token creates the container and sets what a token may set; bind mounts (C(mpN) with a host path),
    C(devN), the features of a privileged container and features other than nesting are sent in a second
    request with a C(root@pam) ticket (O(root_password)). Without O(root_password) they go with the token,
    and Proxmox refuses them with HTTP 403.
options:
  api_host: {description: Proxmox API host., type: str, required: true}
  api_port: {description: Proxmox API port., type: int, default: 8006}
  api_user: {description: API user (user@realm)., type: str, required: true}
  api_token_id: {description: API token id (the part after C(!))., type: str, required: true}
  api_token_secret: {description: API token secret., type: str, required: true}
  validate_certs: {description: Verify TLS., type: bool, default: true}
  ca_path: {description: CA bundle that signed the API certificate; the system store when unset., type: path}
  root_password: {description: root@pam password for the root-only keys (ticket)., type: str}
  node: {description: Proxmox node name., type: str, required: true}
  vmid: {description: Container id., type: int, required: true}
  state:
    description: Wanted run state.
    type: str
    default: started
    choices: [present, started, stopped, restarted]
  hostname: {description: Container hostname., type: str, required: true}
  ostemplate: {description: Template volume id (C(storage:vztmpl/file))., type: str, required: true}
  ostype: {description: OS type of the template., type: str, default: ubuntu}
  cores: {description: CPU cores., type: int, required: true}
  memory: {description: Memory in MiB., type: int, required: true}
  swap: {description: Swap in MiB., type: int, default: 0}
  rootfs_storage: {description: Storage of the root filesystem., type: str, required: true}
  rootfs_size_gb: {description: Root filesystem size in GiB (grown, never shrunk)., type: int, required: true}
  net0: {description: C(net0) property string., type: str, required: true}
  features: {description: Feature flags such as C(nesting=1)., type: list, elements: str, default: []}
  onboot: {description: Start at boot., type: bool, default: true}
  unprivileged: {description: Unprivileged container., type: bool, default: true}
  ssh_public_keys:
    {description: Authorised SSH public keys (set at creation)., type: list, elements: str, default: []}
  mounts:
    description: Bind mounts from host paths, as C(mp0), C(mp1), ... in list order.
    type: list
    elements: dict
    default: []
  devices:
    description: Device node paths passed through as C(dev0), C(dev1), ...; other C(devN) entries are removed.
      Leave unset to not manage C(devN).
    type: list
    elements: str
  dev_mode: {description: Access mode of the passed-through nodes (C(0[0-7]{3}))., type: str, default: "0660"}
  dev_gid: {description: Group id of the passed-through nodes in the container., type: int, default: 0}
  tag:
    description:
      - Proxmox tag set at creation that marks the container as this product's. An existing container
        without it is refused, never adopted. "" turns the check off.
    type: str
    default: ""
  restart_on_change: {description: Restart a running CT whose config changed., type: bool, default: true}
  timeout: {description: Seconds to wait for each Proxmox task., type: int, default: 300}
"""

RETURN = r"""
created: {description: Whether the container was created., type: bool, returned: always}
updated: {description: Config keys that were set or removed., type: list, returned: always}
config: {description: The container config after the run (as planned in check mode)., type: dict}
status: {description: Run state after the run., type: str, returned: always}
"""

import re  # noqa: E402 - Ansible modules document first

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules document first
from ansible.module_utils.pve_ct_api import (  # noqa: E402
    API_ARGS,
    call,
    connect,
    connect_root,
    prop_matches,
    split_prop,
    wait_task,
)

# Changes Proxmox keeps pending on a running container (applied at the next start).
RESTART_KINDS = ("dev", "mp", "features")
DEFAULT_KEYS = {"rootfs": "volume", "mp": "volume", "dev": "path"}


def _kind(key):
    return key.rstrip("0123456789")


def desired_config(p):
    """The managed part of the config, as Proxmox stores it."""
    cfg = {
        "hostname": p["hostname"],
        "cores": str(p["cores"]),
        "memory": str(p["memory"]),
        "swap": str(p["swap"]),
        "net0": p["net0"],
        "onboot": "1" if p["onboot"] else "0",
        "ostype": p["ostype"],
    }
    if p["features"]:
        cfg["features"] = ",".join(p["features"])
    for i, m in enumerate(p["mounts"]):
        if "host_path" not in m or "mount_point" not in m:
            raise ValueError(f"mounts[{i}] needs host_path and mount_point, got {sorted(m)!r}")
        unknown = set(m) - {"host_path", "mount_point", "read_only", "create", "owner", "group", "mode"}
        if unknown:
            raise ValueError(f"mounts[{i}]: unknown keys {sorted(unknown)} (host_path, mount_point, "
                             "read_only, create, owner, group, mode)")
        ro = ",ro=1" if m.get("read_only") else ""
        cfg[f"mp{i}"] = f"{m['host_path']},mp={m['mount_point']}{ro}"
    for i, path in enumerate(p["devices"] or []):
        # pve-container prints the keys after the path sorted (gid, mode, uid); uid 0 is its default
        gid = f",gid={p['dev_gid']}" if p["dev_gid"] else ""
        cfg[f"dev{i}"] = f"{path}{gid},mode={p['dev_mode']}"
    return cfg


def root_only(key, value, unprivileged, oldconf):
    """True for the keys pve-container lets only the literal root@pam set or delete (src/PVE/LXC.pm
    check_ct_modify_config_perm, lines 1665-1738): non-volume mount points, devN, hookscript, the
    features of a privileged container, and features other than nesting."""
    kind = _kind(key)
    if kind in ("mp", "rootfs"):
        return value is not None and split_prop(value, "volume").get("volume", "").startswith("/")
    if kind == "dev" or key == "hookscript":
        return True
    if key == "features":
        if not unprivileged:
            return True
        old = split_prop((oldconf or {}).get("features", ""))
        new = split_prop(value or "")
        return any(old.get(f, "") != new.get(f, "") for f in set(old) | set(new) if f != "nesting")
    return False


def split_root(params, unprivileged, oldconf, delete=()):
    """(token part, root part) of a config update; `delete` keys are sorted the same way."""
    token = {k: v for k, v in params.items() if not root_only(k, v, unprivileged, oldconf)}
    root = {k: v for k, v in params.items() if k not in token}
    root_delete = [k for k in delete if root_only(k, None, unprivileged, oldconf) or _kind(k) == "dev"]
    token_delete = [k for k in delete if k not in root_delete]
    if token_delete:
        token["delete"] = ",".join(token_delete)
    if root_delete:
        root["delete"] = ",".join(root_delete)
    return token, root


def put_config(module, ct, root_ct, vmid, token_part, root_part):
    """PUT the token part with the token, then the root-only part with the root@pam ticket (or the token
    when no root password is set: Proxmox then answers 403, as pve-container does)."""
    root_who = "a root@pam ticket" if root_ct is not None else "the API token"
    for part, client, who in ((token_part, ct, "the API token"), (root_part, root_ct or ct, root_who)):
        if part:
            call(
                module,
                "update CT {} config ({}) with {}".format(vmid, ", ".join(sorted(part)), who),
                client.config.put,
                **part,
            )


def matches(key, current, wanted):
    if current is None:
        return False
    kind = _kind(key)
    if kind in ("net", "features", "mp", "dev", "rootfs"):
        ignore = ("hwaddr", "type") if kind == "net" else ()
        return prop_matches(current, wanted, DEFAULT_KEYS.get(kind), ignore) and (
            kind != "dev" or split_prop(current, "path").get("path") == split_prop(wanted, "path").get("path")
        )
    return str(current) == str(wanted)


def create(module, api, root_api, want):
    p = module.params
    token_part, root_part = split_root(want, p["unprivileged"], None)
    if root_api is None:  # everything with the token: real PVE refuses the root-only keys (403)
        token_part, root_part = dict(want), {}
    params = dict(
        token_part,
        vmid=p["vmid"],
        ostemplate=p["ostemplate"],
        unprivileged=int(p["unprivileged"]),
        rootfs=f"{p['rootfs_storage']}:{p['rootfs_size_gb']}",
    )
    if p["tag"]:
        params["tags"] = p["tag"]
    if p["ssh_public_keys"]:
        params["ssh-public-keys"] = "\n".join(p["ssh_public_keys"]) + "\n"
    if module.check_mode:
        return want
    upid = call(module, "create CT {}".format(p["vmid"]), api.nodes(p["node"]).lxc.post, **params)
    wait_task(module, api, p["node"], upid, p["timeout"], "create CT {}".format(p["vmid"]))
    if root_part:
        put_config(module, None, root_api.nodes(p["node"]).lxc(p["vmid"]), p["vmid"], {}, root_part)
    return call(module, "read CT {} config".format(p["vmid"]), api.nodes(p["node"]).lxc(p["vmid"]).config.get)


def tags_of(config):
    """The tags of a guest config: PVE stores them `;`-separated and accepts `,`, `;` and spaces
    (pve-guest-common src/PVE/GuestHelpers.pm get_unique_tags, split on /[;, ]/)."""
    return {t.lower() for t in re.split(r"[;, ]+", str(config.get("tags", ""))) if t}


def converge(module, api, current, want):
    """Return (changed keys, deleted keys, rootfs growth in GiB or 0)."""
    p = module.params
    if p["tag"] and p["tag"].lower() not in tags_of(current):
        module.fail_json(
            msg="CT {vmid} exists but does not carry the tag '{tag}' that this role sets when it creates "
            "the container (its tags: {tags}): it was not created by this product, and converging it would "
            "rewrite its config and restart it. Choose a free pve_ct_vmid, or, to adopt this container on "
            "purpose, add the tag in Proxmox (pct set {vmid} --tags '{tag}', keeping its other tags).".format(
                vmid=p["vmid"], tag=p["tag"], tags=current.get("tags") or "none"
            )
        )
    if int(current.get("unprivileged", 0)) != int(p["unprivileged"]):
        was_unpriv = bool(int(current.get("unprivileged", 0)))
        module.fail_json(
            msg="CT {vmid} is {was}privileged but pve_ct_unprivileged={want}: Proxmox fixes that "
            "at creation (it owns every file of the rootfs as the mapped ids), so it cannot be changed in "
            "place. Either set pve_ct_unprivileged: {keep} to keep it as it is{warn}, or back it up and "
            "re-create it: vzdump {vmid}, then pct restore {vmid} <backup> --unprivileged {flag} --force "
            "(Proxmox maps the files' owners), or pct destroy {vmid} and run the play again.".format(
                vmid=p["vmid"], was="un" if was_unpriv else "", want=str(p["unprivileged"]).lower(),
                keep=str(was_unpriv).lower(), flag=int(p["unprivileged"]),
                warn="" if was_unpriv else " (the play then prints what a privileged container gives away)",
            )
        )
    rootfs = split_prop(current.get("rootfs", ""), "volume")
    storage = rootfs.get("volume", "").split(":")[0]
    if storage != p["rootfs_storage"]:
        module.fail_json(
            msg="CT {} has its rootfs on storage '{}', not pve_ct_rootfs_storage='{}'; moving it is not "
            "managed by this role".format(p["vmid"], storage, p["rootfs_storage"])
        )
    size = rootfs.get("size", "0G")
    size_gb = (
        float(size[:-1]) * {"T": 1024, "G": 1, "M": 1 / 1024}.get(size[-1], 1) if size[-1:].isalpha() else 0
    )
    grow = p["rootfs_size_gb"] if p["rootfs_size_gb"] > size_gb else 0
    if p["rootfs_size_gb"] < size_gb:
        module.warn(
            "CT {} rootfs is {}, larger than pve_ct_rootfs_size_gb={}: disks are never shrunk".format(
                p["vmid"], size, p["rootfs_size_gb"]
            )
        )
    changed = {k: v for k, v in want.items() if not matches(k, current.get(k), v)}
    stale = [k for k in current if _kind(k) == "dev" and k not in want] if p["devices"] is not None else []
    return changed, sorted(stale), grow


def main():
    args = dict(API_ARGS)
    args.update(
        node=dict(type="str", required=True),
        vmid=dict(type="int", required=True),
        state=dict(type="str", default="started", choices=["present", "started", "stopped", "restarted"]),
        hostname=dict(type="str", required=True),
        ostemplate=dict(type="str", required=True),
        ostype=dict(type="str", default="ubuntu"),
        cores=dict(type="int", required=True),
        memory=dict(type="int", required=True),
        swap=dict(type="int", default=0),
        rootfs_storage=dict(type="str", required=True),
        rootfs_size_gb=dict(type="int", required=True),
        net0=dict(type="str", required=True),
        features=dict(type="list", elements="str", default=[]),
        onboot=dict(type="bool", default=True),
        unprivileged=dict(type="bool", default=True),
        ssh_public_keys=dict(type="list", elements="str", default=[], no_log=False),
        mounts=dict(type="list", elements="dict", default=[]),
        devices=dict(type="list", elements="str"),
        dev_mode=dict(type="str", default="0660"),
        dev_gid=dict(type="int", default=0),
        tag=dict(type="str", default=""),
        restart_on_change=dict(type="bool", default=True),
        timeout=dict(type="int", default=300),
    )
    module = AnsibleModule(argument_spec=args, supports_check_mode=True)
    p = module.params
    api, _version = connect(module)
    root_api = connect_root(module)
    node, vmid = p["node"], p["vmid"]
    nodes = [n["node"] for n in call(module, "list nodes", api.nodes.get)]
    if node not in nodes:
        module.fail_json(msg=f"Proxmox node '{node}' (pve_ct_node) is not in the cluster; nodes: {nodes}")
    try:
        want = desired_config(p)
    except ValueError as exc:
        module.fail_json(msg=f"pve_ct_bind_mounts: {exc}")
    ct = api.nodes(node).lxc(vmid)
    vms = call(module, "list cluster resources", api.cluster.resources.get, type="vm")
    exists = any(int(v["vmid"]) == vmid for v in vms)
    result = dict(changed=False, created=False, updated=[], vmid=vmid)
    before = {}
    if not exists:
        after = create(module, api, root_api, want)
        result.update(changed=True, created=True, updated=sorted(want))
        status = "stopped"
    else:
        current = call(module, f"read CT {vmid} config", ct.config.get)
        before = {k: v for k, v in current.items() if k in want or _kind(k) == "dev"}
        changed, stale, grow = converge(module, api, current, want)
        after = dict(current, **changed)
        for key in stale:
            after.pop(key)
        if (changed or stale) and not module.check_mode:
            token_part, root_part = split_root(
                changed, bool(int(current.get("unprivileged", 0))), current, stale
            )
            root_ct = root_api.nodes(node).lxc(vmid) if root_api is not None else None
            put_config(module, ct, root_ct, vmid, token_part, root_part)
        if grow and not module.check_mode:
            upid = call(module, f"grow CT {vmid} rootfs", ct.resize.put, disk="rootfs", size=f"{int(grow)}G")
            wait_task(module, api, node, upid, p["timeout"], f"grow CT {vmid} rootfs")
        result["updated"] = (
            sorted(changed) + ["delete:" + k for k in stale] + (["rootfs:size"] if grow else [])
        )
        result["changed"] = bool(result["updated"])
        status = call(module, f"read CT {vmid} status", ct.status.current.get)["status"]
    status, actions = run_state(
        module,
        api,
        ct,
        status,
        not result["created"]
        and any(_kind(k.replace("delete:", "")) in RESTART_KINDS for k in result["updated"]),
    )
    if actions:
        result.update(changed=True, actions=actions)
    result.update(
        config=after,
        status=status,
        diff=dict(
            before={k: before[k] for k in sorted(before)},
            after={k: v for k, v in sorted(after.items()) if k in want or _kind(k) == "dev"},
        ),
    )
    module.exit_json(**result)


def run_state(module, api, ct, status, config_changed):
    """Bring the container to the wanted run state; returns (the state it ends in, actions taken)."""
    p = module.params
    wanted = p["state"]
    actions = []
    if wanted == "restarted" or (
        wanted == "started" and status == "running" and config_changed and p["restart_on_change"]
    ):
        actions = (["stop"] if status == "running" else []) + ["start"]
    elif wanted == "started" and status != "running":
        actions = ["start"]
    elif wanted == "stopped" and status == "running":
        actions = ["stop"]
    for action in actions:
        if not module.check_mode:
            upid = call(module, "{} CT {}".format(action, p["vmid"]), getattr(ct.status, action).post)
            wait_task(module, api, p["node"], upid, p["timeout"], "{} CT {}".format(action, p["vmid"]))
    if actions:
        return ("running" if actions[-1] == "start" else "stopped"), actions
    return status, actions


if __name__ == "__main__":
    main()
