#!/usr/bin/env python3
"""A test double of the Proxmox VE HTTP API (a real Proxmox VE cannot run here).

Serves, over HTTPS, the endpoints role `pve_ct` uses: version, ticket and API-token authentication,
nodes, storage content, template download (aplinfo and download-url), cluster nextid/resources,
LXC create/config GET+PUT/resize/status/start/stop/shutdown/delete, and task status/log. It keeps its
state in a JSON file (so a test can read and seed it), answers with real-format UPIDs and task states
(a task is `running` for a short while, then `stopped` with `OK`), and rejects what the real API
rejects: unknown parameters ("property is not defined in schema"), bad types, enums and patterns,
missing required parameters, an unknown template, a VMID that exists, a rootfs on storage that cannot
hold containers, a bad token (401). Every request is appended as one JSON line to `--log` so tests can
check what was sent against the real API schema. Stdlib only.

Permissions are pve-container's, by user: only the literal `root@pam` (a ticket from /access/ticket)
may set bind mounts, `devN`, the features of a privileged container, or features other than nesting;
an API token `root@pam!NAME` is refused those with HTTP 403 and pve-container's message (see
`check_ct_modify_config_perm` below). What a token may do besides is decided by its privilege
separation (pve-access-control src/PVE/RPCEnvironment.pm `permissions`, commit 5ccd07d, lines 136-177):
with `--token-privsep 0` (what `pveum user token add root@pam ansible --privsep 0` makes) it has its
user's privileges, root@pam's being all; with `--token-privsep 1` (pveum's and the GUI's default) only
what `--token-acl PATH=PRIV,...` grants it, the most specific path winning (compile_acl_path, lines 19-).
Privileged calls check them as Proxmox does: the endpoint's `permissions.check` from the API schema
(pve_api_schema.PERMS) and the checks in the code (create, config), with HTTP 403 `Permission check
failed (PATH, PRIV)`; GET /access/permissions answers as the real one does.

    python3 tests/doubles/pve_api.py --host 127.0.0.1 --port 8006 --cert C --key K \
        --state FILE --token 'root@pam!ansible=SECRET' [--root-password PW] [--log FILE] [--node pve1] \
        [--hook CMD] [--token-privsep 0|1] [--token-acl PATH=PRIV,PRIV ...]

`--hook CMD` runs `CMD EVENT VMID` (EVENT: vzcreate, vzstart, vzstop, vzdestroy) with the container's
config as JSON on stdin when a task of that kind runs; a non-zero exit fails the task like a failed
`lxc-start`. The lab uses it to make a real (podman) container for CT 200 (`pve_api_lab.py hook`, beside
this file).

`--dev-root DIR` is the host's / for the containers' `devN` paths: create, config and start stat each one
there as pve-container does, and fail as it does when one is missing (see `Api._passthrough`); without it
devN paths are not looked at (tests whose "host" has no /dev/nvidia*). `--boot` says that this
start of the double is the host's boot: every CT was stopped by the shutdown, and pve-guests.service starts
the onboot ones (see `Api.startall`) before the double answers, so a test runs the units ordered before
pve-guests (nvidia-dev-nodes) between stopping the double and starting it with `--boot`.

It is not Proxmox: storage is bookkeeping only, nothing is unpacked, and pending (hot-plug) config
changes are applied at once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

try:  # imported as tests.doubles.pve_api, or run as a script from its folder
    from .pve_api_schema import PERMS, ApiError, check_params, route
except ImportError:
    from pve_api_schema import PERMS, ApiError, check_params, route  # type: ignore[no-redef]

TASK_SECONDS = 0.05
# create_vm parameters that are not container config (src/PVE/API2/LXC.pm extract_param calls)
_CREATE_ONLY = (
    "vmid",
    "node",
    "ostemplate",
    "password",
    "ssh-public-keys",
    "storage",
    "start",
    "pool",
    "unprivileged",
    "restore",
    "force",
    "unique",
    "ignore-unpack-errors",
    "bwlimit",
    "ha-managed",
)
APLINFO = [
    "ubuntu-24.04-standard_24.04-2_amd64.tar.zst",
    "debian-12-standard_12.12-1_amd64.tar.zst",
]


def default_state(node: str) -> dict[str, Any]:
    """A fresh single-node cluster: `local` (templates) and `scratch` (container volumes)."""
    return {
        "version": {"version": "8.4.1", "release": "8.4", "repoid": "2a5fa54a8503f96d"},
        "node": node,
        "storage": {
            "local": {"type": "dir", "content": ["vztmpl", "iso", "backup"], "volumes": []},
            "scratch": {"type": "zfspool", "content": ["rootdir", "images"], "volumes": []},
        },
        "cts": {},
        "tasks": {},
        "pid": 4096,
    }


class State:
    """The double's persistent state, guarded by one lock and saved after every change. With `pve_dir`
    it also writes each container's `lxc/VMID.conf` there as Proxmox does (keys sorted, raw `lxc.*`
    lines kept, `[snapshot]` sections kept as they are)."""

    def __init__(self, path: Path, node: str, pve_dir: Path | None = None) -> None:
        self.path = path
        self.pve_dir = pve_dir
        self.lock = threading.Lock()
        self.data = json.loads(path.read_text()) if path.exists() else default_state(node)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)
        if self.pve_dir is not None:
            self.write_confs()

    def write_confs(self) -> None:
        assert self.pve_dir is not None
        lxc_dir = self.pve_dir / "lxc"
        lxc_dir.mkdir(parents=True, exist_ok=True)
        for conf in lxc_dir.glob("*.conf"):
            if conf.stem not in self.data["cts"]:
                conf.unlink()
        for vmid, ct in self.data["cts"].items():
            conf = lxc_dir / f"{vmid}.conf"
            old = conf.read_text().splitlines() if conf.exists() else []
            cut = next((i for i, line in enumerate(old) if line.startswith("[")), len(old))
            raw = [line for line in old[:cut] if line.startswith("lxc.")]
            main = [f"{k}: {v}" for k, v in sorted(ct["config"].items())]
            conf.write_text("\n".join(main + raw + (["", *old[cut:]] if old[cut:] else [])) + "\n")

    def task(self, kind: str, ident: str, user: str, exitstatus: str = "OK") -> str:
        d = self.data
        d["pid"] += 1
        now = int(time.time())
        upid = f"UPID:{d['node']}:{d['pid']:08X}:{d['pid'] * 7:08X}:{now:08X}:{kind}:{ident}:{user}:"
        d["tasks"][upid] = {
            "type": kind,
            "id": ident,
            "user": user,
            "starttime": now,
            "pid": d["pid"],
            "done_at": time.time() + TASK_SECONDS,
            "exitstatus": exitstatus,
        }
        return upid


# Role Administrator: every privilege (pve-access-control src/PVE/AccessControl.pm $privgroups, 1057-).
ADMIN_PRIVS = frozenset(
    [
        "VM.Config.Disk",
        "VM.Config.CPU",
        "VM.Config.Memory",
        "VM.Config.Network",
        "VM.Config.HWType",
        "VM.Config.Options",
        "VM.Allocate",
        "VM.Clone",
        "VM.GuestAgent.Unrestricted",
        "VM.Migrate",
        "VM.Replicate",
        "VM.Snapshot",
        "VM.Snapshot.Rollback",
        "VM.Config.CDROM",
        "VM.Config.Cloudinit",
        "VM.Console",
        "VM.Backup",
        "VM.GuestAgent.FileRead",
        "VM.GuestAgent.FileSystemMgmt",
        "VM.GuestAgent.FileWrite",
        "VM.PowerMgmt",
        "VM.Audit",
        "VM.GuestAgent.Audit",
        "Sys.PowerMgmt",
        "Sys.Modify",
        "Sys.Incoming",
        "Sys.AccessNetwork",
        "Sys.Console",
        "Sys.Syslog",
        "Sys.Audit",
        "Datastore.Allocate",
        "Datastore.AllocateTemplate",
        "Datastore.AllocateSpace",
        "Datastore.Audit",
        "SDN.Allocate",
        "SDN.Audit",
        "SDN.Use",
        "Realm.Allocate",
        "User.Modify",
        "Group.Allocate",
        "Realm.AllocateUser",
        "Permissions.Modify",
        "Pool.Allocate",
        "Pool.Audit",
        "Mapping.Audit",
        "Mapping.Modify",
        "Mapping.Use",
    ]
)
# GET /access/permissions without `path`: these paths and the ACL's (RPCEnvironment.pm 241-).
_DEFAULT_PERM_PATHS = ("/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms")


def _perm_exc(what: str) -> ApiError:
    """pve-common PVE/Exception.pm raise_perm_exc: HTTP 403, "Permission check failed (WHAT)"."""
    return ApiError(403, f"Permission check failed ({what})")


def check_ct_modify_config_perm(
    user: str,
    oldconf: dict[str, Any] | None,
    newconf: dict[str, str],
    delete: list[str],
    unprivileged: bool,
    check: Callable[[str, list[str]], None] | None = None,
    vmid: str = "",
) -> None:
    """pve-container src/PVE/LXC.pm check_ct_modify_config_perm (commit 94f5585, lines 1655-1756):
    called by create_vm (src/PVE/API2/LXC.pm 324-326), update_vm (src/PVE/API2/LXC/Config.pm 179-212)
    and resize (src/PVE/API2/LXC.pm 2372). A token's user is `root@pam!NAME`, which is not the literal
    'root@pam' (line 1658). With `check(path, privs)` (Api.check) the per-key privileges are checked
    too (VM.Config.* on /vms/VMID, Datastore.AllocateSpace for a new volume, SDN.Use for a bridge)."""
    if user == "root@pam":
        return
    vm = f"/vms/{vmid}"

    def need(path: str, *privs: str) -> None:
        if check is not None:
            check(path, list(privs))

    for opt, is_delete in [(k, False) for k in newconf] + [(k, True) for k in delete]:
        if opt in ("cores", "cpuunits", "cpulimit"):  # line 1663
            need(vm, "VM.Config.CPU")
        elif opt == "rootfs" or re.fullmatch(r"mp\d+", opt):
            need(vm, "VM.Config.Disk")  # line 1666
            if is_delete:
                continue
            volume = _split_prop(str(newconf[opt]), "volume").get("volume", "")
            kind = (
                "bind"
                if volume.startswith("/") and not volume.startswith("/dev/")
                else ("device" if volume.startswith("/dev/") else "volume")
            )
            if kind != "volume":  # line 1669
                raise _perm_exc(f"mount point type {kind} is only allowed for root@pam")
            new_disk = re.fullmatch(r"([a-z][a-z0-9\-_.]*):(\d+(\.\d+)?)", volume)
            if new_disk:  # lines 1672-1674 ($NEW_DISK_RE)
                need(f"/storage/{new_disk.group(1)}", "Datastore.AllocateSpace")
        elif opt in ("memory", "swap"):  # line 1680
            need(vm, "VM.Config.Memory")
        elif re.fullmatch(r"net\d+", opt):  # lines 1682-1685, check_bridge_access 1758-1769
            need(vm, "VM.Config.Network")
            for raw in ((oldconf or {}).get(opt), None if is_delete else newconf[opt]):
                net = _split_prop(str(raw), None) if raw else {}
                if net.get("bridge") and check is not None:
                    # pve-guest-common src/PVE/GuestHelpers.pm check_vnet_access (4a8f6cb, 397-420)
                    tag = f"/{net['tag']}" if net.get("tag") else ""
                    need(f"/sdn/zones/localnetwork/{net['bridge']}{tag}", "SDN.Use")
        elif re.fullmatch(r"dev\d+", opt):  # line 1687
            raise _perm_exc("configuring device passthrough is only allowed for root@pam")
        elif opt in ("nameserver", "searchdomain", "hostname"):  # line 1688
            need(vm, "VM.Config.Network")
        elif opt == "features":
            if not unprivileged:  # lines 1690-1693
                raise _perm_exc(
                    "changing feature flags for privileged container is only allowed for root@pam"
                )
            old = _split_prop(str((oldconf or {}).get("features", "")), None)
            new = {} if is_delete else _split_prop(str(newconf[opt]), None)
            changed = {f for f in set(old) | set(new) if old.get(f, "") != new.get(f, "")}
            if changed - {"nesting"}:  # lines 1731-1733
                raise _perm_exc("changing feature flags (except nesting) is only allowed for root@pam")
            if changed:  # lines 1734-1735
                need(vm, "VM.Allocate")
        elif opt == "hookscript":  # line 1738
            raise _perm_exc("changing the hookscript is only allowed for root@pam")
        elif opt != "tags":  # line 1744
            need(vm, "VM.Config.Options")


_TAG = re.compile(r"[a-z0-9_][a-z0-9_\-+.]*", re.I)  # pve-common JSONSchema.pm pve-tag format


def normalize_tags(
    vmid: str, old: str | None, new: str, check: Callable[[str, list[str]], None]
) -> str:
    """pve-guest-common src/PVE/GuestHelpers.pm: `assert_tag_permissions` (VM.Config.Options on the guest
    for any added or removed tag; datacenter.cfg `user-tag-access` defaults to `free`, so any tag) and
    `get_unique_tags` (split on /[;, ]/, case-insensitive unique, sorted, stored `;`-joined)."""
    tags = [t for t in re.split(r"[;, ]+", new) if t]
    for t in tags:
        if not _TAG.fullmatch(t):
            raise ApiError(400, f"Parameter verification failed. tags: invalid format - invalid tag '{t}'")
    before = {t.lower() for t in re.split(r"[;, ]+", old or "") if t}
    if before != {t.lower() for t in tags}:
        check(f"/vms/{vmid}", ["VM.Config.Options"])
    unique: dict[str, str] = {}
    for t in tags:
        unique.setdefault(t.lower(), t)
    return ";".join(unique[k] for k in sorted(unique))


def _split_prop(value: str, default_key: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in value.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
        elif default_key:
            out[default_key] = part
    return out


# An unprivileged container's ids: pve-container writes `lxc.idmap = u 0 100000 65536` and the same for
# groups unless the config has its own lxc.idmap lines (src/PVE/LXC.pm update_lxc_config, commit 94f5585,
# lines 799-802; parse_id_maps, 2900-2930). A privileged container maps nothing: its root is the host's.
DEFAULT_ID_MAP = (("u", 0, 100000, 65536), ("g", 0, 100000, 65536))


def id_map(cfg: dict[str, Any]) -> list[tuple[str, int, int, int]]:
    """The container's id map, as parse_id_maps reads it: the config's raw `lxc.idmap` entries (`lxc`, a
    list of [key, value] pairs as pve-container parses them: `u|g CT HOST COUNT`), else the default for an
    unprivileged container, else none."""
    out = []
    for key, value in cfg.get("lxc", []):
        if key != "lxc.idmap":
            continue
        m = re.fullmatch(r"([ug])\s+(\d+)\s+(\d+)\s+(\d+)\s*", value.strip())
        if not m:
            raise ApiError(500, f"failed to parse idmap: {value.strip()}")
        out.append((m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))))
    if not out and int(cfg.get("unprivileged", 0)):
        out = list(DEFAULT_ID_MAP)
    return out


def map_ct_id_to_host(ident: int, idmap: list[tuple[str, int, int, int]], kind: str) -> int:
    """src/PVE/LXC.pm map_ct_id_to_host (lines 2967-2983): the host id of a container id; an id no
    range maps is returned as it is."""
    for typ, ct, host, length in idmap:
        if typ == kind and ct <= ident < ct + length:
            return host - ct + ident
    return ident


IdMap = list[tuple[str, int, int, int]]


def passthrough_node(spec: str, st_mode: int, st_rdev: int, idmap: IdMap) -> dict[str, Any]:
    """The device node Proxmox makes for a `devN` entry at container start, from the host node's stat:
    the prestart hook stats the host path (src/lxc-pve-prestart-hook 161-179; a path that is not a block
    or character device is refused, src/PVE/LXC/Tools.pm get_device_mode_and_rdev 153-164), and
    create_passthrough_device_node (src/PVE/LXC.pm 1897-1921) makes a node of the same type and numbers,
    sets `mode` (default 0660) and chowns it to `uid`/`gid` (default 0) mapped to host ids through the
    container's id map. The autodev hook then bind-mounts it at the same path in the container, where
    an unprivileged container sees those ids as its own."""
    opts = _split_prop(spec, "path")
    path = opts["path"]
    if not (stat.S_ISCHR(st_mode) or stat.S_ISBLK(st_mode)):
        raise ApiError(500, f"{path} is not a device")
    return {
        "path": path,
        "type": "c" if stat.S_ISCHR(st_mode) else "b",
        "major": os.major(st_rdev),
        "minor": os.minor(st_rdev),
        "mode": int(opts.get("mode", "0660"), 8),
        "uid": map_ct_id_to_host(int(opts.get("uid", 0)), idmap, "u"),
        "gid": map_ct_id_to_host(int(opts.get("gid", 0)), idmap, "g"),
        "deny_write": opts.get("deny-write", "0") in ("1", "true", "yes", "on"),
    }


class Api:
    """The endpoint handlers; each takes (state, user, path vars, params) and returns `data`."""

    def __init__(
        self,
        state: State,
        token: str,
        root_password: str | None = None,
        hook: str | None = None,
        token_privsep: bool = False,
        token_acl: dict[str, set[str]] | None = None,
        bind_root: Path | None = None,
        dev_root: Path | None = None,
    ) -> None:
        self.state = state
        # Where the host's filesystem is, for the bind mounts' source directories (None: not checked)
        self.bind_root = bind_root
        # Where the host's / is for devN paths (None: not checked)
        self.dev_root = dev_root
        self.token = token
        self.token_privsep = token_privsep
        self.token_acl = {(k.rstrip("/") or "/"): set(v) for k, v in (token_acl or {}).items()}
        # root@pam's password for /access/ticket; without --root-password the token secret (old behaviour)
        self.root_password = root_password if root_password is not None else token.rpartition("=")[2]
        self.hook = hook
        self.hook_errors: dict[str, list[str]] = {}  # the last failed hook's stderr, shown in its task log
        self.ticket = "PVE:root@pam:66F00000::double-ticket"
        self.csrf = "66F00000:double-csrf"

    # -- auth ------------------------------------------------------------------------------------
    def authenticate(self, headers: Any, method: str) -> str:
        auth = headers.get("Authorization", "")
        if auth.startswith("PVEAPIToken="):
            ident, _, secret = auth[len("PVEAPIToken=") :].rpartition("=")
            want_ident, _, want_secret = self.token.rpartition("=")
            if ident == want_ident and secret == want_secret:
                return ident
            raise ApiError(401, "authentication failure")
        cookie = headers.get("Cookie", "")
        if f"PVEAuthCookie={self.ticket}" in unquote(cookie):
            if method != "GET" and headers.get("CSRFPreventionToken") != self.csrf:
                raise ApiError(401, "Permission denied - invalid csrf token")
            return "root@pam"
        raise ApiError(401, "No ticket")

    def login(self, params: dict[str, str]) -> dict[str, Any]:
        user = params.get("username", "")
        if "@" not in user:
            user += "@pam"
        if user != "root@pam" or params.get("password") != self.root_password:
            raise ApiError(401, "authentication failure")
        return {"username": user, "ticket": self.ticket, "CSRFPreventionToken": self.csrf}

    # -- permissions -----------------------------------------------------------------------------
    def permissions(self, user: str, path: str) -> set[str]:
        """RPCEnvironment.pm `permissions` (136-177): root@pam has all; a token without privilege
        separation has its user's (here always root@pam's: all); a privsep token what its most specific
        ACL entry on the path grants (ACLs propagate; a deeper entry overrides, as roles() resolves)."""
        if user == "root@pam" or ("!" in user and not self.token_privsep):
            return set(ADMIN_PRIVS)
        path = path.rstrip("/") or "/"
        for cut in [path] + [path[:i] or "/" for i in range(len(path) - 1, -1, -1) if path[i] == "/"]:
            if cut in self.token_acl:
                return set(self.token_acl[cut])
        return set()

    def check(self, user: str, path: str, privs: list[str], any_: bool = False) -> None:
        """RPCEnvironment.pm `check` / `check_any`: 403 "Permission check failed (PATH, PRIV)"."""
        have = self.permissions(user, path)
        if any_:
            if not have & set(privs):
                raise _perm_exc(f"{path}, {'|'.join(privs)}")
            return
        for priv in privs:
            if priv not in have:
                raise _perm_exc(f"{path}, {priv}")

    def check_expr(self, user: str, expr: list[Any], pvars: dict[str, str]) -> bool:
        """Evaluate a schema `permissions.check` (["perm", PATH, [PRIVS], "any", 1] / ["and"|"or", ...])."""
        if expr[0] == "perm":
            path = re.sub(r"\{(\w+)\}", lambda m: pvars[m.group(1)], expr[1])
            have = self.permissions(user, path)
            want = set(expr[2])
            return bool(have & want) if "any" in expr[3:] else want <= have
        results = [self.check_expr(user, sub, pvars) for sub in expr[1:]]
        return all(results) if expr[0] == "and" else any(results)

    def check_endpoint(self, user: str, name: str, pvars: dict[str, str]) -> None:
        expr = PERMS.get(name)
        if expr is None or self.check_expr(user, expr, pvars):
            return
        if expr[0] == "perm":  # the message names the path and the privilege(s), as check/check_any do
            path = re.sub(r"\{(\w+)\}", lambda m: pvars[m.group(1)], expr[1])
            missing = [p for p in expr[2] if p not in self.permissions(user, path)]
            raise _perm_exc(f"{path}, {'|'.join(expr[2]) if 'any' in expr[3:] else missing[0]}")
        raise _perm_exc("")

    def access_permissions(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        """GET /access/permissions (pve-access-control src/PVE/API2/AccessControl.pm 509-575): the
        caller's own (or an owned token's) effective privileges, {path: {priv: 1}}; {} for none."""
        userid = p.get("userid", user)
        if userid != user and not userid.startswith(user + "!"):
            self.check(user, "/access", ["Sys.Audit"])
        if p.get("path"):
            perms = self.permissions(userid, p["path"])
            return {p["path"]: {x: 1 for x in sorted(perms)}} if perms else {}
        paths = set(_DEFAULT_PERM_PATHS) | set(self.token_acl)
        out = {path: {x: 1 for x in sorted(self.permissions(userid, path))} for path in sorted(paths)}
        return {k: x for k, x in out.items() if x}

    # -- helpers ---------------------------------------------------------------------------------
    def _node(self, node: str) -> None:
        if node != self.state.data["node"]:
            raise ApiError(595, f"no such cluster node '{node}'")

    def _storage(self, name: str) -> dict[str, Any]:
        st = self.state.data["storage"].get(name)
        if st is None:
            raise ApiError(500, f"storage '{name}' does not exist")
        return st

    def _ct(self, vmid: str) -> dict[str, Any]:
        ct = self.state.data["cts"].get(str(vmid))
        if ct is None:
            raise ApiError(
                500, f"Configuration file 'nodes/{self.state.data['node']}/lxc/{vmid}.conf' does not exist"
            )
        return ct

    def _volume(self, vmid: str, spec: str, key: str) -> str:
        parts = _split_prop(spec, "volume")
        vol = parts.pop("volume", "")
        if ":" not in vol:  # bind mount from a host path
            if key == "rootfs" or not vol.startswith("/"):
                raise ApiError(400, f"{key}: invalid volume '{vol}'", {key: "invalid format"})
            return spec
        storage, _, size = vol.partition(":")
        st = self._storage(storage)
        if "rootdir" not in st["content"]:
            raise ApiError(500, f"storage '{storage}' does not support container directories")
        if not re.fullmatch(r"\d+(\.\d+)?", size):  # an existing volume
            return spec
        n = sum(1 for v in st["volumes"] if v["vmid"] == int(vmid))
        name = f"subvol-{vmid}-disk-{n}"
        st["volumes"].append(
            {
                "volid": f"{storage}:{name}",
                "vmid": int(vmid),
                "content": "rootdir",
                "size": int(float(size) * 1024**3),
            }
        )
        rest = "".join(f",{k}={v}" for k, v in parts.items() if k != "size")
        return f"{storage}:{name}{rest},size={size}G"

    # -- endpoints -------------------------------------------------------------------------------
    def version(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        return self.state.data["version"]

    def nodes(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        return [{"node": self.state.data["node"], "status": "online", "type": "node", "maxcpu": 128}]

    def storage_content(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        self._node(v["node"])
        vols = self._storage(v["storage"])["volumes"]
        return [
            x
            for x in vols
            if ("content" not in p or x["content"] == p["content"])
            and ("vmid" not in p or x.get("vmid") == p["vmid"])
        ]

    def aplinfo_list(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        return [
            {"template": t, "package": t.split("_")[0], "type": "lxc", "os": t.split("-")[0]} for t in APLINFO
        ]

    def _add_template(self, storage: str, filename: str) -> None:
        st = self._storage(storage)
        if "vztmpl" not in st["content"]:
            raise ApiError(500, f"storage '{storage}' does not support vztmpl content")
        volid = f"{storage}:vztmpl/{filename}"
        if not any(x["volid"] == volid for x in st["volumes"]):
            st["volumes"].append({"volid": volid, "content": "vztmpl", "format": "tzst", "size": 141_000_000})

    def aplinfo_download(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        self._node(v["node"])
        if p["template"] not in APLINFO:
            raise ApiError(400, f"no such template '{p['template']}'")
        self._add_template(p["storage"], p["template"])
        return self.state.task("download", p["template"], user)

    def download_url(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        self._node(v["node"])
        if ("checksum" in p) != ("checksum-algorithm" in p):
            raise ApiError(400, "checksum and checksum-algorithm must be given together")
        self._add_template(v["storage"], p["filename"])
        return self.state.task("download", p["filename"], user)

    def nextid(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        used = {int(k) for k in self.state.data["cts"]}
        return str(next(i for i in range(100, 1_000_000) if i not in used))

    def resources(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        node = self.state.data["node"]
        vms = [
            {
                "id": f"lxc/{k}",
                "vmid": int(k),
                "name": ct["config"].get("hostname", f"CT{k}"),
                "node": node,
                "type": "lxc",
                "status": ct["status"],
                "template": 0,
            }
            for k, ct in self.state.data["cts"].items()
        ]
        nodes = [{"id": f"node/{node}", "node": node, "type": "node", "status": "online"}]
        out = {"vm": vms, "node": nodes, None: vms + nodes}
        return out.get(p.get("type"), [])

    def lxc_list(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        self._node(v["node"])
        return [
            {"vmid": k, "name": ct["config"].get("hostname"), "status": ct["status"]}
            for k, ct in self.state.data["cts"].items()
        ]

    def lxc_create(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        self._node(v["node"])
        vmid = str(p["vmid"])
        if vmid in self.state.data["cts"]:
            raise ApiError(500, f"CT {vmid} already exists on node '{v['node']}'")
        # create_vm: unprivileged defaults to 1 (src/PVE/API2/LXC.pm 272), then the permission check (324)
        unpriv = p.get("unprivileged", "1") in ("1", "true", 1, True)
        if not unpriv:  # line 273
            self.check(user, "/", ["Sys.Modify"])
        self.check(user, f"/vms/{vmid}", ["VM.Allocate"])  # lines 295-301 (no pool here)
        rest = {k: x for k, x in p.items() if k not in _CREATE_ONLY}
        check_ct_modify_config_perm(
            user, None, rest, [], unpriv, lambda path, privs: self.check(user, path, privs), vmid
        )
        self._check_devices(rest)
        if "rootfs" not in rest:  # the default rootfs goes on `storage` (line 356)
            self.check(user, f"/storage/{p.get('storage', 'local')}", ["Datastore.AllocateSpace"])
        tstore, _, _tname = p["ostemplate"].partition(":")
        if not any(x["volid"] == p["ostemplate"] for x in self._storage(tstore)["volumes"]):
            raise ApiError(500, f"volume '{p['ostemplate']}' does not exist")
        cfg: dict[str, Any] = {"arch": "amd64", "ostype": "ubuntu", "unprivileged": int(unpriv)}
        for key, val in p.items():
            if key in _CREATE_ONLY:
                continue
            if key == "rootfs" or re.fullmatch(r"mp\d+", key):
                val = self._volume(vmid, val, key)
            if key == "tags":
                val = normalize_tags(vmid, None, str(val), lambda path, privs: self.check(user, path, privs))
            if re.fullmatch(r"net\d+", key) and "hwaddr=" not in str(val):
                val += f",hwaddr=BC:24:11:{int(vmid) % 256:02X}:00:{int(key[3:]):02X},type=veth"
            cfg[key] = val
        if "rootfs" not in cfg:
            cfg["rootfs"] = self._volume(vmid, f"{p.get('storage', 'local')}:4", "rootfs")
        self.state.data["cts"][vmid] = {
            "config": cfg,
            "status": "stopped",
            "ssh_keys": p.get("ssh-public-keys", ""),
            "has_password": "password" in p,
        }
        return self.state.task("vzcreate", vmid, user, self.run_hook("vzcreate", vmid, cfg))

    def lxc_config_get(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        self._node(v["node"])
        cfg = dict(self._ct(v["vmid"])["config"])
        cfg["digest"] = format(abs(hash(json.dumps(cfg, sort_keys=True))), "040x")[:40]
        return cfg

    def lxc_config_put(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        self._node(v["node"])
        ct = self._ct(v["vmid"])
        cfg = ct["config"]
        delete = list(filter(None, p.get("delete", "").split(",")))
        new = {k: x for k, x in p.items() if k not in ("vmid", "node", "delete", "digest", "revert")}
        unpriv = bool(int(cfg.get("unprivileged", 0)))
        checker = lambda path, privs: self.check(user, path, privs)  # noqa: E731
        check_ct_modify_config_perm(user, cfg, {}, delete, unpriv, checker, v["vmid"])
        check_ct_modify_config_perm(user, cfg, new, [], unpriv, checker, v["vmid"])
        self._check_devices(new)
        for key in delete:
            cfg.pop(key, None)
        for key, val in p.items():
            if key in ("vmid", "node", "delete", "digest"):
                continue
            if key == "unprivileged" and int(val) != int(cfg.get("unprivileged", 0)):
                raise ApiError(500, "unable to modify read-only option: 'unprivileged'")
            if key == "rootfs" or re.fullmatch(r"mp\d+", key):
                val = self._volume(v["vmid"], val, key)
            if key == "tags":
                val = normalize_tags(v["vmid"], cfg.get("tags"), str(val), checker)
            cfg[key] = val
        return None

    def lxc_resize(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        ct = self._ct(v["vmid"])
        disk = p["disk"]
        if disk in ct["config"]:  # src/PVE/API2/LXC.pm 2372: the disk's current spec is checked
            spec = {disk: ct["config"][disk]}
            check_ct_modify_config_perm(
                user,
                ct["config"],
                spec,
                [],
                bool(int(ct["config"].get("unprivileged", 0))),
                lambda path, privs: self.check(user, path, privs),
                v["vmid"],
            )
        if disk not in ct["config"]:
            raise ApiError(500, f"disk '{disk}' does not exist")
        m = re.fullmatch(r"\+?(\d+)G", p["size"])
        if not m:
            raise ApiError(400, "unable to parse size", {"size": "value does not match the regex pattern"})
        parts = _split_prop(ct["config"][disk], "volume")
        old = int(parts.get("size", "0G").rstrip("G"))
        new = old + int(m.group(1)) if p["size"].startswith("+") else int(m.group(1))
        if new < old:
            raise ApiError(500, "unable to shrink disk size")
        parts["size"] = f"{new}G"
        ct["config"][disk] = parts.pop("volume") + "".join(f",{k}={x}" for k, x in parts.items())
        return self.state.task("resize", v["vmid"], user)

    def lxc_status(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        ct = self._ct(v["vmid"])
        return {
            "vmid": int(v["vmid"]),
            "status": ct["status"],
            "name": ct["config"].get("hostname"),
            "type": "lxc",
        }

    def _missing_bind_dirs(self, cfg: dict[str, Any]) -> list[str]:
        """The prestart hook mounts every mpN; a bind mount's source must be a directory on the host
        (pve-container src/PVE/LXC.pm, mountpoint_mount: `die "directory '$volid' does not exist\\n" if !
        -d $volid;`), else lxc-start fails and so does the vzstart task."""
        if self.bind_root is None:
            return []
        out = []
        for key, spec in sorted(cfg.items()):
            if re.fullmatch(r"mp\d+", key):
                vol = _split_prop(spec, "volume").get("volume", "")
                if vol.startswith("/") and not (self.bind_root / vol.lstrip("/")).is_dir():
                    out.append(f"directory '{vol}' does not exist")
        return out

    def _passthrough(self, cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        """The devN nodes a start gives the container, and the first devN path that does not exist.

        Every stat of a devN path is pve-container's PVE::LXC::Tools::get_device_mode_and_rdev (commit
        94f5585, src/PVE/LXC/Tools.pm 157-169): "Device PATH does not exist" when stat fails with ENOENT,
        "PATH is not a device" for another file. vm_start calls update_lxc_config (src/PVE/LXC.pm 3125-
        3137), which stats each devN path for its cgroup2 devices.allow line (lines 777-790) before
        `systemctl start pve-container@VMID`: a missing node fails the start task there, with that message
        as its status, and lxc-start never runs. Only a node that goes between that and the prestart hook
        meets the hook's own check ("Could not get mode or device ID of PATH", src/lxc-pve-prestart-hook
        161-168); the double does not model that race. Then the hook makes each node (passthrough_node).
        Both walk the devN keys in Perl's hash order (PVE/LXC/Config.pm foreach_passthrough_device, `keys
        %$conf`), so which of several missing paths is named varies from start to start; the double goes in
        devN order. Without --dev-root nothing is looked at."""
        made: list[dict[str, Any]] = []
        if self.dev_root is None:
            return made, None
        idmap = id_map(cfg)
        for key in sorted((k for k in cfg if re.fullmatch(r"dev\d+", k)), key=lambda k: int(k[3:])):
            path = _split_prop(str(cfg[key]), "path")["path"]
            try:
                st = os.stat(self.dev_root / path.lstrip("/"))  # stat() follows links, as Perl's does
            except FileNotFoundError:
                return made, path
            made.append(passthrough_node(str(cfg[key]), st.st_mode, st.st_rdev, idmap))
        return made, None

    def _check_devices(self, new: dict[str, Any]) -> None:
        """update_pct_config (src/PVE/LXC/Config.pm 1376-1383, run by create_vm before its worker, and by
        the config PUT): a devN whose path does not exist is refused, HTTP 500."""
        _made, absent = self._passthrough({k: x for k, x in new.items() if re.fullmatch(r"dev\d+", k)})
        if absent is not None:
            raise ApiError(500, f"Device {absent} does not exist")

    def _set_status(self, v: dict[str, str], user: str, kind: str, status: str) -> str:
        ct = self._ct(v["vmid"])
        if kind == "vzstart" and ct["status"] == "running":
            raise ApiError(500, f"CT {v['vmid']} already running")
        if kind == "vzstart":
            made, absent = self._passthrough(ct["config"])
            if absent is not None:  # update_lxc_config's die, before lxc-start
                ct.pop("passthrough", None)
                return self.state.task(kind, v["vmid"], user, f"Device {absent} does not exist")
            if self.dev_root is not None:  # /var/lib/lxc/VMID/passthrough: the nodes the CT is given
                ct["passthrough"] = made
        missing = self._missing_bind_dirs(ct["config"]) if kind == "vzstart" else []
        if missing:  # what `pct start` prints: the hook's error, then lxc-start's
            self.hook_errors[str(v["vmid"])] = [*missing, f"startup for container '{v['vmid']}' failed"]
            return self.state.task(kind, v["vmid"], user, f"startup for container '{v['vmid']}' failed")
        exitstatus = self.run_hook(kind, v["vmid"], ct["config"])
        if exitstatus == "OK":
            ct["status"] = status
        return self.state.task(kind, v["vmid"], user, exitstatus)

    def lxc_start(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        return self._set_status(v, user, "vzstart", "running")

    def boot(self) -> str:
        """The host has rebooted: its shutdown stopped every CT (pve-guests' ExecStop, `pvesh create
        /nodes/localhost/stopall`), and the units ordered before pve-guests.service have run; now
        pve-guests starts the onboot CTs (startall). The startall task's UPID."""
        for ct in self.state.data["cts"].values():
            ct["status"] = "stopped"
            ct.pop("passthrough", None)  # /var/lib/lxc/VMID/passthrough is a tmpfs
        return self.startall("root@pam")

    def startall(self, user: str) -> str:
        """pve-guests.service's `pvesh --nooutput create /nodes/localhost/startall` (pve-manager
        services/pve-guests.service; PVE/API2/Nodes.pm startall and get_start_stop_list, commit 14a22df):
        the guests with onboot=1, by `startup` order (none: last) then VMID, each not yet running started
        as vm_start does. Its task log: "Starting CT VMID", and "Starting CT VMID failed: STATUS" for a
        start task that failed (finish_worker); a failed guest start does not fail startall. pvesh runs as
        root@pam. HA-managed guests, which startall skips, are not modelled."""
        order = []
        for vmid, ct in self.state.data["cts"].items():
            cfg = ct["config"]
            if str(cfg.get("onboot", "0")) not in ("1", "true", "yes", "on"):
                continue
            startup = _split_prop(str(cfg["startup"]), "order") if cfg.get("startup") else {}
            order.append((int(startup.get("order") or 2**63 - 1), int(vmid)))  # LONG_MAX when unset
        upid = self.state.task("startall", "", user)
        log: list[str] = []
        for _order, vmid in sorted(order):
            if self.state.data["cts"][str(vmid)]["status"] == "running":
                continue
            log.append(f"Starting CT {vmid}")
            started = self._set_status({"vmid": str(vmid)}, user, "vzstart", "running")
            status = self.state.data["tasks"][started]["exitstatus"]
            if status != "OK":
                log.append(f"Starting CT {vmid} failed: {status}")
        self.state.data["tasks"][upid]["log"] = log
        return upid

    def lxc_stop(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        return self._set_status(v, user, "vzstop", "stopped")

    def lxc_shutdown(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        return self._set_status(v, user, "vzshutdown", "stopped")

    def lxc_delete(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        ct = self._ct(v["vmid"])
        if ct["status"] == "running":
            raise ApiError(500, f"CT {v['vmid']} is running - destroy failed")
        self.run_hook("vzdestroy", v["vmid"], ct["config"])
        del self.state.data["cts"][v["vmid"]]
        for st in self.state.data["storage"].values():
            st["volumes"] = [x for x in st["volumes"] if x.get("vmid") != int(v["vmid"])]
        return self.state.task("vzdestroy", v["vmid"], user)

    def raw_lines(self, vmid: str) -> list[str]:
        """The raw `lxc.*` lines of the CT's config file (with --pve-dir, where raw mode writes them)."""
        pve_dir = self.state.pve_dir
        conf = pve_dir / "lxc" / f"{vmid}.conf" if pve_dir is not None else None
        if conf is None or not conf.exists():
            return []
        lines = conf.read_text().splitlines()
        cut = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
        return [line for line in lines[:cut] if line.startswith("lxc.")]

    def run_hook(self, event: str, vmid: str, cfg: dict[str, Any]) -> str:
        """Run --hook for a task; its exit status, as the task will report it."""
        if not self.hook:
            return "OK"
        raw = self.raw_lines(vmid)
        if raw:  # pve-container keeps a config's raw lxc.* lines as [key, value] pairs under `lxc`
            pairs = (line.partition(":") for line in raw)
            cfg = {**cfg, "lxc": [[k.strip(), x.strip()] for k, _, x in pairs]}
        proc = subprocess.run(
            [*self.hook.split(), event, str(vmid)],
            input=json.dumps(cfg),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            print(f"hook {event} {vmid} failed: {proc.stderr.strip()}", flush=True)
            self.hook_errors[str(vmid)] = proc.stderr.strip().splitlines()[-5:]
            return f"command '{event} {vmid}' failed: exit code {proc.returncode}"
        return "OK"

    def _task(self, v: dict[str, str]) -> dict[str, Any]:
        t = self.state.data["tasks"].get(v["upid"])
        if t is None:
            raise ApiError(500, f"no such task '{v['upid']}'")
        return t

    def task_status(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        t = self._task(v)
        out = {k: t[k] for k in ("type", "id", "user", "starttime", "pid")}
        out.update(upid=v["upid"], node=v["node"], status="running")
        if time.time() >= t["done_at"]:
            out.update(status="stopped", exitstatus=t["exitstatus"])
        return out

    def task_log(self, user: str, v: dict[str, str], p: dict[str, str]) -> Any:
        t = self._task(v)
        lines = [f"starting {t['type']} {t['id']}"]
        if "log" in t:  # what the task printed, where the double models it
            lines += t["log"]
        elif t["exitstatus"] != "OK":
            lines += self.hook_errors.get(str(t["id"]), [])
        lines.append(f"TASK {t['exitstatus']}")
        return [{"n": i + 1, "t": line} for i, line in enumerate(lines)]


def make_handler(api: Api, log_path: Path | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _params(self) -> dict[str, str]:
            url = urlsplit(self.path)
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            if body and "json" in (self.headers.get("Content-Type") or ""):
                params.update(
                    {k: str(int(x) if isinstance(x, bool) else x) for k, x in json.loads(body).items()}
                )
            elif body:
                params.update(parse_qsl(body, keep_blank_values=True))
            return params

        def _reply(self, code: int, payload: dict[str, Any], reason: str | None = None) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code, reason)
            self.send_header("Content-Type", "application/json;charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self, method: str) -> None:
            path = urlsplit(self.path).path
            params = self._params()
            entry: dict[str, Any] = {"method": method, "path": path, "params": params, "status": 200}
            try:
                if not path.startswith("/api2/json/"):
                    raise ApiError(501, f"Method '{method} {path}' not implemented")
                rel = path[len("/api2/json") :]
                if rel == "/access/ticket" and method == "POST":
                    data = api.login(params)
                    entry["params"] = {k: ("***" if k == "password" else x) for k, x in params.items()}
                else:
                    user = api.authenticate(self.headers, method)
                    entry["user"] = user
                    name, pvars = route(method, rel)
                    merged = check_params(method, rel, name, pvars, params)
                    api.check_endpoint(user, name, {k: str(x) for k, x in merged.items()})
                    with api.state.lock:
                        data = getattr(api, name)(user, pvars, merged)
                        if method != "GET":
                            api.state.save()
                self._reply(200, {"data": data})
            except ApiError as e:
                entry["status"] = e.code
                payload: dict[str, Any] = {"data": None, "message": e.message + "\n"}
                if e.errors:
                    payload["errors"] = e.errors
                self._reply(e.code, payload, e.message)
            finally:
                if log_path is not None:
                    with api.state.lock, log_path.open("a") as fh:
                        fh.write(json.dumps(entry) + "\n")

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PUT(self) -> None:
            self._handle("PUT")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

    return Handler


def serve(
    host: str,
    port: int,
    cert: str,
    key: str,
    state: Path,
    token: str,
    log: Path | None,
    node: str = "pve1",
    pve_dir: Path | None = None,
    root_password: str | None = None,
    hook: str | None = None,
    token_privsep: bool = False,
    token_acl: dict[str, set[str]] | None = None,
    bind_root: Path | None = None,
    dev_root: Path | None = None,
    boot: bool = False,
) -> ThreadingHTTPServer:
    """Build the HTTPS server (call `.serve_forever()`); port 0 picks a free one (`.server_address`).
    With `boot`, the host's boot has just happened: pve-guests' startall has run when this returns."""
    api = Api(
        State(state, node, pve_dir), token, root_password, hook, token_privsep, token_acl, bind_root, dev_root
    )
    if boot:
        with api.state.lock:
            api.boot()
            api.state.save()
    httpd = ThreadingHTTPServer((host, port), make_handler(api, log))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    return httpd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8006)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--token", required=True, help="user@realm!tokenid=SECRET")
    ap.add_argument("--log", type=Path, default=None)
    ap.add_argument("--node", default="pve1")
    ap.add_argument("--pve-dir", type=Path, default=None, help="write lxc/VMID.conf files here, as /etc/pve")
    ap.add_argument(
        "--root-password",
        default=os.environ.get("PVE_ROOT_PASSWORD"),
        help="root@pam's password for tickets ($PVE_ROOT_PASSWORD; else the token secret)",
    )
    ap.add_argument("--hook", default=None, help="run 'HOOK EVENT VMID' (config on stdin) per CT task")
    ap.add_argument("--token-privsep", type=int, choices=[0, 1], default=0, help="the token's privsep flag")
    ap.add_argument(
        "--token-acl",
        action="append",
        default=[],
        metavar="PATH=PRIV,PRIV",
        help="privileges an ACL grants the (privsep) token on PATH, propagated (repeatable)",
    )
    ap.add_argument("--bind-root", type=Path, default=None,
                    help="the host's / for bind-mount sources: vzstart fails on a missing one, as in PVE")
    ap.add_argument("--dev-root", type=Path, default=None,
                    help="the host's / for devN paths: vzstart fails on a missing one, as in PVE")
    ap.add_argument("--boot", action="store_true",
                    help="this start is the host's boot: pve-guests starts the onboot CTs (startall)")
    a = ap.parse_args()
    if "!" not in a.token or "=" not in a.token:
        ap.error("--token must look like user@realm!tokenid=SECRET")
    acl: dict[str, set[str]] = {}
    for entry in a.token_acl:
        path, _, privs = entry.partition("=")
        if not path.startswith("/"):
            ap.error(f"--token-acl {entry!r}: must look like /PATH=PRIV,PRIV")
        acl[path] = {x for x in privs.split(",") if x}
    httpd = serve(
        a.host,
        a.port,
        a.cert,
        a.key,
        a.state,
        a.token,
        a.log,
        a.node,
        a.pve_dir,
        a.root_password,
        a.hook,
        bool(a.token_privsep),
        acl,
        a.bind_root,
        a.dev_root,
        a.boot,
    )
    print(f"pve_api double on https://{a.host}:{httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
