"""Routes and parameter rules of the Proxmox API double (tests/doubles/pve_api.py).

The double keeps its own definitions of the endpoints it serves (written from the Proxmox VE API
documentation); they reject what the real API rejects: parameters not in the schema, bad integers,
booleans, enums and patterns, property strings with unknown keys, and missing required parameters.
Stdlib only.
"""

from __future__ import annotations

import re
from typing import Any


class ApiError(Exception):
    """An API failure with its HTTP status, message and per-parameter errors (as Proxmox reports them)."""

    def __init__(self, code: int, message: str, errors: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.errors = errors or {}


NODE = r"(?P<node>[a-zA-Z0-9][a-zA-Z0-9.-]*)"
VMID = r"(?P<vmid>\d+)"
STORAGE = r"(?P<storage>[a-zA-Z][a-zA-Z0-9\-_.]*)"
ROUTES: list[tuple[str, str, str]] = [
    ("GET", r"/version", "version"),
    ("GET", r"/nodes", "nodes"),
    ("GET", rf"/nodes/{NODE}/storage/{STORAGE}/content", "storage_content"),
    ("POST", rf"/nodes/{NODE}/storage/{STORAGE}/download-url", "download_url"),
    ("GET", rf"/nodes/{NODE}/aplinfo", "aplinfo_list"),
    ("POST", rf"/nodes/{NODE}/aplinfo", "aplinfo_download"),
    ("GET", r"/cluster/nextid", "nextid"),
    ("GET", r"/cluster/resources", "resources"),
    ("GET", rf"/nodes/{NODE}/lxc", "lxc_list"),
    ("POST", rf"/nodes/{NODE}/lxc", "lxc_create"),
    ("GET", rf"/nodes/{NODE}/lxc/{VMID}/config", "lxc_config_get"),
    ("PUT", rf"/nodes/{NODE}/lxc/{VMID}/config", "lxc_config_put"),
    ("PUT", rf"/nodes/{NODE}/lxc/{VMID}/resize", "lxc_resize"),
    ("GET", rf"/nodes/{NODE}/lxc/{VMID}/status/current", "lxc_status"),
    ("POST", rf"/nodes/{NODE}/lxc/{VMID}/status/start", "lxc_start"),
    ("POST", rf"/nodes/{NODE}/lxc/{VMID}/status/stop", "lxc_stop"),
    ("POST", rf"/nodes/{NODE}/lxc/{VMID}/status/shutdown", "lxc_shutdown"),
    ("DELETE", rf"/nodes/{NODE}/lxc/{VMID}", "lxc_delete"),
    ("GET", rf"/nodes/{NODE}/tasks/(?P<upid>UPID:[^/]+)/status", "task_status"),
    ("GET", rf"/nodes/{NODE}/tasks/(?P<upid>UPID:[^/]+)/log", "task_log"),
    ("GET", r"/access/permissions", "access_permissions"),
]

NOT_IN_SCHEMA = "property is not defined in schema and the schema does not allow additional properties"
BOOL = "bool"
INT = "int"
STR = "str"
_CT_PROPS = {
    "rootfs": (
        "prop",
        "volume",
        {"volume", "acl", "mountoptions", "quota", "replicate", "ro", "shared", "size"},
    ),
    "mp": (
        "prop",
        "volume",
        {
            "volume",
            "mp",
            "acl",
            "backup",
            "mountoptions",
            "quota",
            "replicate",
            "ro",
            "shared",
            "size",
            "keepattrs",
        },
    ),
    "net": (
        "prop",
        None,
        {
            "name",
            "bridge",
            "firewall",
            "gw",
            "gw6",
            "hwaddr",
            "ip",
            "ip6",
            "link_down",
            "mtu",
            "rate",
            "tag",
            "trunks",
            "type",
            "host-managed",
        },
    ),
    # pve-container src/PVE/LXC/Config.pm $dev_desc (commit 94f5585, lines 1080-1114): the path must be under
    # /dev/ with no `.` or `..` segment (verify_lxc_dev_string, 1063-1078), mode is `0[0-7]{3}`, uid and gid
    # are integers >= 0.
    "dev": (
        "prop",
        "path",
        {"path", "deny-write", "gid", "mode", "uid"},
        {"path": "dev-path", "mode": ("re", r"0[0-7]{3}"), "uid": "uint", "gid": "uint",
         "deny-write": "bool"},
    ),
    "features": ("prop", None, {"force_rw_sys", "fuse", "keyctl", "mknod", "mount", "nesting"}),
}
_CT_COMMON: dict[str, Any] = {
    "arch": ("enum", ["amd64", "i386", "arm64", "armhf", "riscv32", "riscv64"]),
    "cores": INT,
    "cpulimit": STR,
    "cpuunits": INT,
    "description": STR,
    "hostname": ("re", r"[a-zA-Z0-9.-]+"),
    "memory": INT,
    "swap": INT,
    "nameserver": STR,
    "searchdomain": STR,
    "onboot": BOOL,
    "protection": BOOL,
    "ostype": (
        "enum",
        [
            "debian",
            "devuan",
            "ubuntu",
            "centos",
            "fedora",
            "opensuse",
            "archlinux",
            "alpine",
            "gentoo",
            "nixos",
            "unmanaged",
        ],
    ),
    "startup": STR,
    "tags": STR,
    "timezone": STR,
    "tty": INT,
    "unprivileged": BOOL,
    "console": BOOL,
    "cmode": ("enum", ["shell", "console", "tty"]),
    "hookscript": STR,
    "template": BOOL,
    "debug": BOOL,
    "rootfs": _CT_PROPS["rootfs"],
    "features": _CT_PROPS["features"],
    "mp[n]": _CT_PROPS["mp"],
    "net[n]": _CT_PROPS["net"],
    "dev[n]": _CT_PROPS["dev"],
}
# pve-access-control userid_or_token_regex (the schema's `userid` pattern of GET /access/permissions)
_USERID_OR_TOKEN = r"[^\s:/]+@[A-Za-z][A-Za-z0-9.\-_]+(![A-Za-z][A-Za-z0-9.\-_]+)?"
PARAMS: dict[str, tuple[dict[str, Any], set[str]]] = {
    "storage_content": ({"content": STR, "vmid": INT}, set()),
    "download_url": (
        {
            "content": ("enum", ["iso", "vztmpl", "import"]),
            "filename": STR,
            "url": ("re", r"https?://.+"),
            "checksum": STR,
            "checksum-algorithm": ("enum", ["md5", "sha1", "sha224", "sha256", "sha384", "sha512"]),
            "compression": STR,
            "verify-certificates": BOOL,
        },
        {"content", "filename", "url"},
    ),
    "aplinfo_download": ({"storage": STR, "template": STR}, {"storage", "template"}),
    "resources": ({"type": ("enum", ["vm", "storage", "node", "sdn"])}, set()),
    "lxc_create": (
        {
            **_CT_COMMON,
            "vmid": INT,
            "ostemplate": STR,
            "password": STR,
            "ssh-public-keys": STR,
            "storage": STR,
            "start": BOOL,
            "pool": STR,
            "force": BOOL,
            "unique": BOOL,
        },
        {"vmid", "ostemplate"},
    ),
    "lxc_config_put": ({**_CT_COMMON, "delete": STR, "digest": STR, "revert": STR}, set()),
    "lxc_resize": (
        {"disk": ("re", r"rootfs|mp\d+"), "size": ("re", r"\+?\d+(\.\d+)?[KMGT]?"), "digest": STR},
        {"disk", "size"},
    ),
    "lxc_stop": ({"skiplock": BOOL, "overrule-shutdown": BOOL}, set()),
    "lxc_shutdown": ({"timeout": INT, "forceStop": BOOL}, set()),
    "lxc_start": ({"skiplock": BOOL, "debug": BOOL}, set()),
    "lxc_delete": ({"force": BOOL, "purge": BOOL, "destroy-unreferenced-disks": BOOL}, set()),
    "task_log": ({"start": INT, "limit": INT, "download": BOOL}, set()),
    "access_permissions": ({"userid": ("re", _USERID_OR_TOKEN), "path": STR}, set()),
}

# Each endpoint's `permissions.check`, as the API schema (pve-apidata.json) states it; endpoints whose
# schema says `user: all` check in their code (see pve_api.Api) or not at all. tests/roles/test_pve_perms.py
# compares this table with pve-apidata.json when that file is present.
PERMS: dict[str, list[Any]] = {
    "storage_content": [
        "perm",
        "/storage/{storage}",
        ["Datastore.Audit", "Datastore.AllocateSpace"],
        "any",
        1,
    ],
    "download_url": [
        "and",
        ["perm", "/storage/{storage}", ["Datastore.AllocateTemplate"]],
        ["or", ["perm", "/", ["Sys.Audit", "Sys.Modify"]], ["perm", "/nodes/{node}", ["Sys.AccessNetwork"]]],
    ],
    "aplinfo_download": ["perm", "/storage/{storage}", ["Datastore.AllocateTemplate"]],
    "lxc_delete": ["perm", "/vms/{vmid}", ["VM.Allocate"]],
    "lxc_config_get": ["perm", "/vms/{vmid}", ["VM.Audit"]],
    "lxc_config_put": [
        "perm",
        "/vms/{vmid}",
        ["VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options"],
        "any",
        1,
    ],
    "lxc_status": ["perm", "/vms/{vmid}", ["VM.Audit"]],
    "lxc_start": ["perm", "/vms/{vmid}", ["VM.PowerMgmt"]],
    "lxc_stop": ["perm", "/vms/{vmid}", ["VM.PowerMgmt"]],
    "lxc_shutdown": ["perm", "/vms/{vmid}", ["VM.PowerMgmt"]],
    "lxc_resize": ["perm", "/vms/{vmid}", ["VM.Config.Disk"], "any", 1],
}
_INDEXED = {"mp": 256, "net": 32, "dev": 256, "unused": 256}


def route(method: str, rel: str) -> tuple[str, dict[str, str]]:
    """Map (method, path below /api2/json) to a handler name and its path variables."""
    known = False
    for m, pattern, name in ROUTES:
        match = re.fullmatch(pattern, rel)
        if match:
            known = True
            if m == method:
                return name, match.groupdict()
    if known:
        raise ApiError(501, f"Method '{method} /api2/json{rel}' not implemented")
    raise ApiError(501, f"Method '{method} /api2/json{rel}' not implemented (no such path in the double)")


def _spec_for(spec: dict[str, Any], key: str) -> Any:
    if key in spec:
        return spec[key]
    m = re.fullmatch(r"([a-z]+)(\d+)", key)
    if m and f"{m.group(1)}[n]" in spec and int(m.group(2)) < _INDEXED.get(m.group(1), 0):
        return spec[f"{m.group(1)}[n]"]
    return None


def _check_value(kind: Any, value: str) -> str | None:
    """None if `value` is valid for `kind`, else Proxmox's wording of the error."""
    if kind == INT:
        return None if re.fullmatch(r"-?\d+", value) else f"type check ('integer') failed - got '{value}'"
    if kind == BOOL:
        ok = value.lower() in {"0", "1", "true", "false", "yes", "no", "on", "off"}
        return None if ok else f"type check ('boolean') failed - got '{value}'"
    if kind == STR:
        return None
    if kind[0] == "enum":
        return (
            None
            if value in kind[1]
            else f"value '{value}' does not have a value in the enumeration '{', '.join(kind[1])}'"
        )
    if kind[0] == "re":
        return None if re.fullmatch(kind[1], value) else "value does not match the regex pattern"
    _, default_key, keys, *sub = kind
    for i, part in enumerate(value.split(",")):
        if "=" not in part:
            if i == 0 and default_key:
                k, v = default_key, part
            else:
                return f"invalid format - missing key in '{part}'"
        else:
            k, v = part.split("=", 1)
        if k not in keys:
            return f"invalid format - format error\n{k}: {NOT_IN_SCHEMA}"
        err = _check_sub(sub[0].get(k) if sub else None, v)
        if err:
            return f"invalid format - format error\n{k}: {err}"
    return None


def _check_sub(kind: Any, value: str) -> str | None:
    """A property string's value (pve-common PVE/JSONSchema.pm parse_property_string checks each)."""
    if kind is None:
        return None
    if kind == "dev-path":  # verify_lxc_dev_string
        if re.search(r"/\.\.?(?:/|$)", value) or not value.startswith("/dev/"):
            return f"invalid format - {value} is not a valid device path"
        return None
    if kind == "uint":
        return None if re.fullmatch(r"\d+", value) else f"type check ('integer') failed - got '{value}'"
    if kind == "bool":
        return _check_value(BOOL, value)
    return _check_value(kind, value)


def check_params(
    method: str, rel: str, name: str, pvars: dict[str, str], params: dict[str, str]
) -> dict[str, Any]:
    """Validate request parameters as the real API does; return them typed (integers and booleans as int,
    as Proxmox stores them) and merged with the path variables."""
    spec, required = PARAMS.get(name, ({}, set()))
    errors: dict[str, str] = {}
    for key, value in params.items():
        if key in pvars:
            if value != pvars[key]:
                errors[key] = f"value '{value}' differs from the one in the path"
            continue
        kind = _spec_for(spec, key)
        if kind is None:
            errors[key] = NOT_IN_SCHEMA
            continue
        err = _check_value(kind, value)
        if err:
            errors[key] = err
    for key in required - set(params) - set(pvars):
        errors[key] = "property is missing and it is not optional"
    if errors:
        raise ApiError(400, "Parameter verification failed.", errors)
    typed: dict[str, Any] = {}
    for key, value in params.items():
        kind = _spec_for(spec, key)
        if kind == INT:
            typed[key] = int(value)
        elif kind == BOOL:
            typed[key] = int(value.lower() in {"1", "true", "yes", "on"})
        else:
            typed[key] = value
    return {**typed, **pvars}
