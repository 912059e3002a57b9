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
    token creates the container and sets what a token may set. Bind mounts (C(mpN) with a host path),
    C(devN), the features of a privileged container and features other than nesting are for the literal
    C(root@pam) alone: they never go through the API. The module returns them as RV(pct_args), the
    arguments of C(pct set VMID) that the role runs on the Proxmox host as root (pct acts as root@pam,
    pve-container src/PVE/CLI/pct.pm), and leaves the run state alone (RV(deferred)) until a second call
    with O(config_changed) brings the container to it.
options:
  api_host: {description: Proxmox API host., type: str, required: true}
  api_port: {description: Proxmox API port., type: int, default: 8006}
  api_user: {description: API user (user@realm)., type: str, required: true}
  api_token_id: {description: API token id (the part after C(!))., type: str, required: true}
  api_token_secret: {description: API token secret., type: str, required: true}
  validate_certs: {description: Verify TLS., type: bool, default: true}
  ca_path: {description: CA bundle that signed the API certificate; the system store when unset., type: path}
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
  config_changed:
    description: The config was changed since the call that returned RV(deferred) (by C(pct set)); a running
      CT is restarted as O(restart_on_change) says.
    type: bool
    default: false
  timeout: {description: Seconds to wait for each Proxmox task., type: int, default: 300}
"""

RETURN = r"""
created: {description: Whether the container was created., type: bool, returned: always}
updated: {description: Config keys that were set or removed., type: list, returned: always}
config: {description: The container config after the run (as planned in check mode)., type: dict}
status: {description: Run state after the run., type: str, returned: always}
pct_args:
  description: The root-only keys still to set, as arguments of C(pct set VMID) (C(--dev0 PATH,...),
    C(--delete dev8)); empty when nothing is left.
  type: list
  returned: always
deferred:
  description: Whether root-only keys are left to set, in which case the run state was not touched.
  type: bool
  returned: always
restart_needed:
  description: Whether a key Proxmox applies at the next start (C(devN), C(mpN), C(features)) changed on the
    existing container, in this call or in the root-only keys left to set.
  type: bool
  returned: always
"""

import re  # noqa: E402 - Ansible modules document first

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules document first
from ansible.module_utils.pve_ct_api import (  # noqa: E402
    API_ARGS,
    call,
    connect,
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
            raise ValueError(
                f"mounts[{i}]: unknown keys {sorted(unknown)} (host_path, mount_point, "
                "read_only, create, owner, group, mode)"
            )
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


def pct_args(root_part):
    """`pct set VMID` arguments for the root-only part of an update: `--KEY VALUE` per key (sorted), then
    `--delete KEYS` (pct takes the API's parameters as options, pve-container src/PVE/CLI/pct.pm `set`)."""
    delete = root_part.get("delete")
    args = [a for k in sorted(k for k in root_part if k != "delete") for a in (f"--{k}", str(root_part[k]))]
    return args + (["--delete", delete] if delete else [])


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


def create(module, api, want):
    """Create the container with what the token may set; returns (its config, the root-only part)."""
    p = module.params
    token_part, root_part = split_root(want, p["unprivileged"], None)
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
        return want, root_part
    upid = call(module, "create CT {}".format(p["vmid"]), api.nodes(p["node"]).lxc.post, **params)
    wait_task(module, api, p["node"], upid, p["timeout"], "create CT {}".format(p["vmid"]))
    config = call(
        module, "read CT {} config".format(p["vmid"]), api.nodes(p["node"]).lxc(p["vmid"]).config.get
    )
    return dict(config, **{k: v for k, v in root_part.items() if k != "delete"}), root_part


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
                vmid=p["vmid"],
                was="un" if was_unpriv else "",
                want=str(p["unprivileged"]).lower(),
                keep=str(was_unpriv).lower(),
                flag=int(p["unprivileged"]),
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
        config_changed=dict(type="bool", default=False),
        timeout=dict(type="int", default=300),
    )
    module = AnsibleModule(argument_spec=args, supports_check_mode=True)
    p = module.params
    api, _version = connect(module)
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
    root_part = {}
    if not exists:
        after, root_part = create(module, api, want)
        result.update(changed=True, created=True, updated=sorted(want))
        status = "stopped"
    else:
        current = call(module, f"read CT {vmid} config", ct.config.get)
        before = {k: v for k, v in current.items() if k in want or _kind(k) == "dev"}
        changed, stale, grow = converge(module, api, current, want)
        after = dict(current, **changed)
        for key in stale:
            after.pop(key)
        token_part, root_part = split_root(changed, bool(int(current.get("unprivileged", 0))), current, stale)
        if token_part and not module.check_mode:
            call(
                module,
                "update CT {} config ({})".format(vmid, ", ".join(sorted(token_part))),
                ct.config.put,
                **token_part,
            )
        if grow and not module.check_mode:
            upid = call(module, f"grow CT {vmid} rootfs", ct.resize.put, disk="rootfs", size=f"{int(grow)}G")
            wait_task(module, api, node, upid, p["timeout"], f"grow CT {vmid} rootfs")
        result["updated"] = (
            sorted(changed) + ["delete:" + k for k in stale] + (["rootfs:size"] if grow else [])
        )
        result["changed"] = bool(result["updated"])
        status = call(module, f"read CT {vmid} status", ct.status.current.get)["status"]
    restart_needed = not result["created"] and any(
        _kind(k.replace("delete:", "")) in RESTART_KINDS for k in result["updated"]
    )
    result.update(pct_args=pct_args(root_part), deferred=bool(root_part), restart_needed=restart_needed)
    if not root_part:  # with root-only keys left to set, the role starts the CT once pct has set them
        status, actions = run_state(module, api, ct, status, restart_needed or p["config_changed"])
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
