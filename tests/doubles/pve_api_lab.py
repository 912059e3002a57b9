#!/usr/bin/env python3
"""The lab's Proxmox: the API double (pve_api.py) as a daemon on the controller, and its hook that makes
each container the double creates a real podman container, so the lab runs site.yml in production order
(CT 200 does not exist before site.yml; role pve_ct creates it through the API, then the next plays
configure it). A real Proxmox VE cannot run here.

    pve_api_lab.py start --dir .lab/pve --config .lab/pve/lab.json   # (re)start the double if needed
    pve_api_lab.py stop --dir .lab/pve                               # stop it (bin/lab down)
    pve_api_lab.py hook --config FILE EVENT VMID < config.json       # called by the double (--hook)

`lab.json` (written by playbooks/lab.yml): {"double": {...pve_api.py options...}, "cts": {"200":
{"name": "lab-ct200", "image": ..., "network": ..., "host": "lab-pve", "volumes": [...], "setup": "sh"}}}.
On `vzstart` the hook runs the container if it does not exist (bind mounts `mpN` of the "Proxmox host"
container are mapped to this machine's paths through that container's own mounts; hostname from the CT
config) and, once its systemd has booted, runs `setup` in it (at every start: it is idempotent);
`vzstop`/`vzshutdown` stop it, `vzdestroy` removes it. Mount and device changes after the first start
are not re-applied (podman cannot add mounts to a container).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def _exists(name: str) -> bool:
    return _podman("container", "exists", name, check=False).returncode == 0


def _host_path(host: str, path: str) -> str:
    """The path on this machine behind `path` in container `host` (through its bind mounts)."""
    mounts = json.loads(_podman("inspect", host, "--format", "{{json .Mounts}}").stdout)
    under = [m for m in mounts if (path + "/").startswith(m["Destination"].rstrip("/") + "/")]
    best = max(
        under,
        key=lambda m: len(m["Destination"]),
        default=None,
    )
    if best is None:
        raise SystemExit(f"bind mount source {path} does not exist on the Proxmox host {host}")
    return best["Source"] + path[len(best["Destination"].rstrip("/")) :]


def _ip(name: str, network: str) -> str:
    fmt = "{{json .NetworkSettings.Networks}}"
    return json.loads(_podman("inspect", name, "--format", fmt).stdout)[network]["IPAddress"]


def run_ct(spec: dict[str, Any], cfg: dict[str, Any]) -> None:
    """podman run the container for a CT config: hostname, bind mounts (mpN), the lab's extra volumes."""
    args = ["run", "-d", "--name", spec["name"], "--hostname", str(cfg.get("hostname", spec["name"]))]
    args += ["--network", spec["network"], "--systemd", "always", "--runtime", "runc"]
    args += ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--cap-add", "MKNOD"]
    for key in sorted(k for k in cfg if k.startswith("mp")):
        parts = str(cfg[key]).split(",")
        opts = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        if parts[0].startswith("/"):  # a bind mount from the Proxmox host
            ro = ":ro" if opts.get("ro") == "1" else ""
            args += ["-v", f"{_host_path(spec['host'], parts[0])}:{opts['mp']}{ro}"]
    for vol in spec.get("volumes", []):
        args += ["-v", vol]
    for other in spec.get("add_hosts", []):
        if _exists(other):
            args += ["--add-host", f"{other}:{_ip(other, spec['network'])}"]
    _podman(*args, spec["image"], "/lib/systemd/systemd")


def setup(spec: dict[str, Any], timeout: float = 120.0) -> None:
    """Wait until systemd in the container has booted (it mounts /tmp), then run the lab's setup script
    (idempotent; run at every start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _podman("exec", spec["name"], "systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            break
        time.sleep(1)
    else:
        raise SystemExit(f"{spec['name']}: systemd did not finish booting in {timeout:.0f}s ({state})")
    if spec.get("setup"):
        _podman("exec", spec["name"], "sh", "-ec", spec["setup"])


def hook(config: Path, event: str, vmid: str) -> int:
    spec = json.loads(config.read_text())["cts"].get(str(vmid))
    if spec is None:
        return 0  # a CT the lab has no container for: bookkeeping only
    cfg = json.loads(sys.stdin.read() or "{}")
    name = spec["name"]
    try:
        if event == "vzstart":
            if _exists(name):
                _podman("start", name)
            else:
                run_ct(spec, cfg)
            setup(spec)
        elif event in ("vzstop", "vzshutdown") and _exists(name):
            _podman("stop", "-t", "10", name)
        elif event == "vzdestroy":
            _podman("rm", "-f", name, check=False)
    except subprocess.CalledProcessError as exc:
        print(f"{' '.join(exc.cmd)}: {exc.stderr.strip()}", file=sys.stderr)
        return 1
    return 0


def _alive(pidfile: Path) -> int:
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return 0


def start(directory: Path, config: Path) -> str:
    """Start the double unless it already runs with the same options and code; print what was done."""
    directory.mkdir(parents=True, exist_ok=True)
    opts = json.loads(config.read_text())["double"]
    hook_cmd = f"{sys.executable} {Path(__file__).resolve()} hook --config {config.resolve()}"
    argv = [sys.executable, str(HERE / "pve_api.py"), "--hook", hook_cmd]
    for key, val in opts.items():
        argv += [f"--{key}", str(val)]
    code = "".join((HERE / n).read_text() for n in ("pve_api.py", "pve_api_schema.py", "pve_api_lab.py"))
    digest = hashlib.sha256((json.dumps(argv) + code).encode()).hexdigest()
    pidfile, sumfile = directory / "double.pid", directory / "double.sha256"
    if _alive(pidfile) and sumfile.exists() and sumfile.read_text() == digest:
        return "running"
    stop(directory)
    with (directory / "double.log").open("ab") as log:
        proc = subprocess.Popen(  # close_fds: the daemon must not inherit a caller's lock (flock bin/lab)
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True, start_new_session=True
        )
    pidfile.write_text(str(proc.pid))
    sumfile.write_text(digest)
    time.sleep(0.5)
    if proc.poll() is not None:
        raise SystemExit(f"the Proxmox API double exited at once: see {directory / 'double.log'}")
    return "started"


def stop(directory: Path) -> str:
    pid = _alive(directory / "double.pid")
    if pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not _alive(directory / "double.pid"):
                break
            time.sleep(0.1)
    (directory / "double.pid").unlink(missing_ok=True)
    return "stopped" if pid else "not running"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("--config", type=Path, required=True)
    t = sub.add_parser("stop")
    t.add_argument("--dir", type=Path, required=True)
    h = sub.add_parser("hook")
    h.add_argument("--config", type=Path, required=True)
    h.add_argument("event")
    h.add_argument("vmid")
    a = ap.parse_args()
    if a.cmd == "hook":
        return hook(a.config, a.event, a.vmid)
    print(start(a.dir, a.config) if a.cmd == "start" else stop(a.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
