"""Shared Proxmox API plumbing for the pve_ct modules: connect with an API token over verified TLS, turn
proxmoxer/requests failures into messages that name the endpoint and the setting at fault, wait for tasks
(UPIDs), and compare Proxmox property strings. The keys pve-container lets only root@pam set never go
through the API: the role sets them with `pct set` on the Proxmox host, as root."""

from __future__ import annotations

import time

try:
    import proxmoxer
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import ResourceException

    HAS_PROXMOXER = True
    PROXMOXER_VERSION = getattr(proxmoxer, "__version__", "0")
except ImportError:  # reported by fail_json in connect()
    HAS_PROXMOXER = False
    PROXMOXER_VERSION = None
    ResourceException = Exception

API_ARGS = dict(
    api_host=dict(type="str", required=True),
    api_port=dict(type="int", default=8006),
    api_user=dict(type="str", required=True),
    api_token_id=dict(type="str", required=True),
    api_token_secret=dict(type="str", required=True, no_log=True),
    validate_certs=dict(type="bool", default=True),
    ca_path=dict(type="path", default=None),
)


def endpoint(params):
    return "https://{}:{}/api2/json".format(params["api_host"], params["api_port"])


def explain(params, exc, what):
    """A one-line reason for a failed API call, naming the endpoint and the likely setting at fault."""
    text = str(exc)
    token = "{}!{}".format(params["api_user"], params["api_token_id"])
    if getattr(exc, "status_code", None) == 403 and "root@pam" in text:
        return (
            f"Proxmox API at {endpoint(params)} refused to {what} for '{token}' (HTTP 403 {text}): "
            "pve-container lets only the literal root@pam set these keys; the role sets them with "
            "`pct set` on the Proxmox host instead"
        )
    if getattr(exc, "status_code", None) == 401 or text.startswith("401"):
        return (
            f"Proxmox API at {endpoint(params)} rejected API token '{token}' while trying to {what} "
            f"(HTTP 401 {text}): check pve_ct_api_user, pve_ct_api_token_id and pve_ct_api_token_secret"
        )
    if "CERTIFICATE_VERIFY_FAILED" in text or "SSLError" in text:
        return (
            f"TLS verification of {endpoint(params)} failed while trying to {what}: set pve_ct_api_ca_path "
            f"to the CA that signed the Proxmox host certificate ({text})"
        )
    if "Connection" in text or "Max retries" in text:
        return f"cannot reach the Proxmox API at {endpoint(params)} to {what}: {text}"
    return f"Proxmox API {endpoint(params)} failed to {what}: {text}"


def _verify(p):
    verify = p["validate_certs"]
    if verify and p.get("ca_path"):
        verify = p["ca_path"]
    return verify


def connect(module):
    """A ProxmoxAPI client authenticated with the token; fails the module with a clear message."""
    p = module.params
    if not HAS_PROXMOXER or int(str(PROXMOXER_VERSION).split(".")[0] or 0) < 2:
        module.fail_json(
            msg=f"proxmoxer >= 2 is required where the pve_ct modules run (found {PROXMOXER_VERSION}); "
            "Proxmox VE 8 ships python3-proxmoxer 1.2, so the role runs them on the controller "
            "(pve_ct_api_delegate_to, default localhost) whose venv has proxmoxer 2"
        )
    verify = _verify(p)
    try:
        api = ProxmoxAPI(
            p["api_host"],
            port=p["api_port"],
            user=p["api_user"],
            token_name=p["api_token_id"],
            token_value=p["api_token_secret"],
            verify_ssl=verify,
            timeout=30,
        )
        version = api.version.get()
    except Exception as exc:
        module.fail_json(msg=explain(p, exc, "read /version"))
    return api, version


def call(module, what, fn, *args, **kwargs):
    """Run one API call; on failure end the module with a message naming `what` was being done."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        module.fail_json(msg=explain(module.params, exc, what))


def wait_task(module, api, node, upid, timeout, what):
    """Poll a task until it stops; fail unless its exit status is OK (or a warning)."""
    deadline = time.time() + timeout
    while True:
        status = call(module, f"read the status of task {upid}", api.nodes(node).tasks(upid).status.get)
        if status.get("status") == "stopped":
            exitstatus = status.get("exitstatus", "")
            if exitstatus == "OK" or exitstatus.startswith("WARNINGS"):
                return status
            log = call(module, f"read the log of task {upid}", api.nodes(node).tasks(upid).log.get, limit=20)
            module.fail_json(msg=f"Proxmox task {upid} ({what}) ended with '{exitstatus}'", task_log=log)
        if time.time() > deadline:
            module.fail_json(msg=f"Proxmox task {upid} ({what}) still running after {timeout}s")
        time.sleep(0.2)


def split_prop(value, default_key=None):
    """Parse a Proxmox property string ('local:8,size=8G' or 'name=eth0,ip=dhcp') into a dict."""
    out = {}
    for i, part in enumerate(str(value).split(",")):
        if "=" in part:
            key, val = part.split("=", 1)
            out[key] = val
        elif i == 0 and default_key:
            out[default_key] = part
    return out


def prop_matches(current, wanted, default_key=None, ignore=()):
    """True when every key of `wanted` has the same value in `current` (other keys of current are kept)."""
    cur = split_prop(current, default_key)
    want = split_prop(wanted, default_key)
    return all(cur.get(k) == v for k, v in want.items() if k not in ignore)
