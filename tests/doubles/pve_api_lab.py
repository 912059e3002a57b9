#!/usr/bin/env python3
"""The lab's Proxmox: the API double (pve_api.py) as a daemon on the controller, and its hook that makes
each container the double creates a real podman container, so the lab runs site.yml in production order
(CT 200 does not exist before site.yml; role pve_ct creates it through the API, then the next plays
configure it). A real Proxmox VE cannot run here.

    pve_api_lab.py start --dir .lab/pve --config .lab/pve/lab.json   # (re)start the double if needed
    pve_api_lab.py stop --dir .lab/pve                               # stop it (bin/lab down)
    pve_api_lab.py hook --config FILE EVENT VMID < config.json       # called by the double (--hook)
    pve_api_lab.py prune NAME...                                     # remove lab containers that are dead
    pve_api_lab.py boot NAME                      # restart an unprivileged container, its cgroup its root's
    pve_api_lab.py nodes DIR --gpus N             # the GPU nodes Proxmox makes for an unprivileged CT
    pve_api_lab.py kill-unit NAME UNIT            # SIGKILL a unit's processes in a CT, as a host that dies

`lab.json` (written by lab/playbook.yml): {"double": {...pve_api.py options...}, "cts": {"200":
{"name": "lab-ct200", "image": ..., "network": ..., "host": "lab-pve", "volumes": [...], "setup": "sh"}}}.
On `vzcreate` the hook removes any podman container of the CT's name: the CT is being created, so a
container of that name is a leftover of an earlier lab (another checkout, a `bin/lab` cut short) and
must not stand in for it. On `vzstart` the hook runs the container if it does not exist or is dead
(bind mounts `mpN` of the "Proxmox host" container are mapped to this machine's paths through that
container's own mounts; hostname from the CT config) and, once its systemd has booted, runs `setup` in it
(at every start: it is idempotent). A CT the state has running whose container is gone or dead is set
stopped when the double starts, as a Proxmox host's CTs are after a reboot.
`vzstop`/`vzshutdown` stop it, `vzdestroy` removes it. Mount and device changes after the first start
are not re-applied (podman cannot add mounts to a container).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

try:  # imported as tests.doubles.pve_api_lab, or run (or loaded) from its folder
    from .pve_api import id_map, passthrough_node
except ImportError:
    sys.path.insert(0, str(HERE))
    from pve_api import id_map, passthrough_node  # type: ignore[no-redef]


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def _exists(name: str) -> bool:
    return _podman("container", "exists", name, check=False).returncode == 0


def _usable(name: str) -> bool:
    """Whether podman can run a process in the container. A container whose processes died outside
    podman (its session's machine was torn down) still reads "Up" in `podman ps`, but `podman exec`
    answers "cannot exec in a stopped container" and `podman start` does nothing: only rm helps."""
    return _podman("exec", name, "true", check=False).returncode == 0


def prune(names: list[str]) -> list[str]:
    """Remove the named containers that exist but are dead (see _usable); the ones removed."""
    dead = [n for n in names if _exists(n) and not _usable(n)]
    for name in dead:
        _podman("rm", "-f", name, check=False)
    return dead


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


def _host_stat(host: str, path: str) -> tuple[int, int]:
    """(st_mode, st_rdev) of `path` in container `host` (the Proxmox host's /dev), as Proxmox stats it at
    every start; its message when the path is missing: vm_start's update_lxc_config refuses the start
    before lxc-start runs (pve-container PVE::LXC::Tools::get_device_mode_and_rdev; see
    pve_api.Api._passthrough)."""
    proc = _podman("exec", host, "stat", "-L", "-c", "%f %t %T", path, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"Device {path} does not exist")
    mode, major, minor = proc.stdout.split()
    return int(mode, 16), os.makedev(int(major, 16), int(minor, 16))


def passthrough_devices(spec: dict[str, Any], cfg: dict[str, Any], directory: Path) -> list[str]:
    """Make the nodes Proxmox makes for the config's devN entries (pve_api.passthrough_node: same type and
    numbers as the host's node, the entry's mode, uid and gid mapped to host ids) in `directory`, as
    pve-container does in /var/lib/lxc/VMID/passthrough, and return the podman volumes that bind-mount
    each at its path in the container, as its autodev hook does."""
    idmap = id_map(cfg)
    volumes = []
    for key in sorted((k for k in cfg if re.fullmatch(r"dev\d+", k)), key=lambda k: int(k[3:])):
        node = passthrough_node(str(cfg[key]), *_host_stat(spec["host"], str(cfg[key]).split(",")[0]), idmap)
        made = directory / node["path"].lstrip("/")
        made.parent.mkdir(parents=True, exist_ok=True)
        made.unlink(missing_ok=True)
        kind = stat.S_IFCHR if node["type"] == "c" else stat.S_IFBLK
        os.mknod(made, kind | node["mode"], os.makedev(node["major"], node["minor"]))
        os.chown(made, node["uid"], node["gid"])
        os.chmod(made, node["mode"])  # as Proxmox does: mknod's mode is cut by the umask
        volumes += ["-v", f"{made}:{node['path']}"]
    return volumes


def run_ct(spec: dict[str, Any], cfg: dict[str, Any], passthrough: Path) -> None:
    """Create and start the podman container for a CT config: hostname, the id map of an unprivileged CT,
    GPU nodes (devN), bind mounts (mpN), the lab's extra volumes."""
    args = ["create", "--name", spec["name"], "--hostname", str(cfg.get("hostname", spec["name"]))]
    args += ["--network", spec["network"], "--systemd", "always", "--runtime", "runc"]
    args += ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
    idmap = id_map(cfg)
    for typ, ct, host, length in idmap:  # the container's ids are these host ids, as under LXC
        args += [f"--{'uid' if typ == 'u' else 'gid'}map", f"{ct}:{host}:{length}"]
    if not idmap:
        args += ["--cap-add", "MKNOD"]  # a privileged CT's root may make device nodes
    args += passthrough_devices(spec, cfg, passthrough)
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
    start_ct(spec["name"], idmap)


def link_cts(cts: dict[str, Any], name: str) -> None:
    """Let the lab's CTs find each other by name, as hosts on one network do through DNS (podman's CNI
    network here has none): `name` and every other running lab CT each get the other's address in
    /etc/hosts (appended in place: podman bind-mounts the file). The nodes of a multi-node run meet at
    node 0's name."""
    spec = next(s for s in cts.values() if s["name"] == name)
    others = [s["name"] for s in cts.values()
              if s["name"] != name and _exists(s["name"]) and _usable(s["name"])]
    for a, b in [(a, b) for o in others for a, b in ((name, o), (o, name))]:
        ip = _ip(b, spec["network"])
        line = f"{ip} {b}"
        _podman("exec", a, "sh", "-c", f"grep -qx '{line}' /etc/hosts || echo '{line}' >> /etc/hosts")


def delegate(name: str, idmap: list[tuple[str, int, int, int]]) -> None:
    """Give the container's control group to its root, as LXC does for a container whose root is mapped
    (lxc src/lxc/cgroups/cgfsng.c, cgfsng_chown: the container's cgroup directories are chowned to the
    container's root), so that the systemd in an unprivileged container can manage its own units."""
    ident = _podman("inspect", name, "--format", "{{.Id}}").stdout.strip()
    root_uid = next((host for typ, ct, host, _n in idmap if typ == "u" and ct == 0), 0)
    root_gid = next((host for typ, ct, host, _n in idmap if typ == "g" and ct == 0), 0)
    # podman names the container's cgroup after its id (libpod-ID under libpod_parent with cgroupfs,
    # libpod-ID.scope under machine.slice with systemd); only those directories, never a hierarchy's root.
    tops = [p for base in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup") if len(ident) == 64
            for p in Path(base).glob(f"*/libpod-{ident}*") if p.is_dir()]
    for top in tops:
        for path in [top, *top.rglob("*")]:
            with contextlib.suppress(OSError):  # read-only control files stay as they are
                os.chown(path, root_uid, root_gid)


def start_ct(name: str, idmap: list[tuple[str, int, int, int]]) -> None:
    """Start the container; an unprivileged one gets its control group first: `podman init` makes the
    cgroup, delegate() gives it to the container's root, then the init process starts."""
    if not idmap:
        _podman("start", name)
        return
    _podman("init", name)
    delegate(name, idmap)
    _podman("start", name)


def make_nodes(directory: Path, gpus: int, gid: int = 44, mode: str = "0660") -> list[Path]:
    """The nodes Proxmox makes in an unprivileged CT for `devN: /dev/nvidiaN,gid=GID,mode=MODE` (and
    nvidiactl), from fake host nodes (char 195:N, 195:255): owned by the container's root and group GID,
    mapped to host ids (pve_api.passthrough_node). A test platform bind-mounts them at /dev/nvidia*."""
    idmap = id_map({"unprivileged": 1})
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for name, minor in [*((f"nvidia{i}", i) for i in range(gpus)), ("nvidiactl", 255)]:
        node = passthrough_node(f"/dev/{name},gid={gid},mode={mode}", stat.S_IFCHR | 0o666,
                                os.makedev(195, minor), idmap)
        path = directory / name
        path.unlink(missing_ok=True)
        os.mknod(path, stat.S_IFCHR | node["mode"], os.makedev(node["major"], node["minor"]))
        os.chown(path, node["uid"], node["gid"])
        os.chmod(path, node["mode"])
        made.append(path)
    return made


def setup(spec: dict[str, Any], timeout: float = 120.0) -> None:
    """Wait until systemd in the container has booted (it mounts /tmp), then run the lab's setup script
    (idempotent; run at every start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = _podman("exec", spec["name"], "systemctl", "is-system-running", check=False)
        state = proc.stdout.strip()
        if state in ("running", "degraded"):
            break
        if "stopped container" in proc.stderr or "no such container" in proc.stderr:
            raise SystemExit(f"{spec['name']}: the container stopped while booting: {proc.stderr.strip()}")
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
        if event == "vzcreate":
            _podman("rm", "-f", name, check=False)
        elif event == "vzstart":
            prune([name])
            if _exists(name):
                start_ct(name, id_map(cfg))
            else:
                run_ct(spec, cfg, config.resolve().parent / "passthrough" / str(vmid))
            setup(spec)
            link_cts(json.loads(config.read_text())["cts"], name)
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


def serving(program: bytes, flag: bytes, port: int) -> list[int]:
    """The pids of processes running `program` (an argv entry ending so) with `flag PORT` in their argv."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(program) for a in argv) and flag in argv:
            i = argv.index(flag)
            if i + 1 < len(argv) and argv[i + 1] == str(port).encode() and int(proc.name) != os.getpid():
                pids.append(int(proc.name))
    return pids


def other_doubles(port: int) -> list[int]:
    """The pids of pve_api.py doubles serving `port` (another checkout's lab, left running)."""
    return serving(b"pve_api.py", b"--port", port)


def mark_stopped(state_path: Path, vmids: list[str]) -> None:
    """Set these CTs stopped in the double's state file, as a Proxmox host's CTs are after a reboot."""
    if not vmids:
        return
    state = json.loads(state_path.read_text())
    for vmid in vmids:
        state["cts"][vmid]["status"] = "stopped"
    state_path.write_text(json.dumps(state, indent=1, sort_keys=True))


def lost_cts(lab: dict[str, Any], state_path: Path) -> list[str]:
    """The CTs the double's state has running whose podman container is missing or dead."""
    if not state_path.exists():
        return []
    cts = json.loads(state_path.read_text()).get("cts", {})
    return [
        vmid
        for vmid, spec in lab.get("cts", {}).items()
        if cts.get(vmid, {}).get("status") == "running"
        and not (_exists(spec["name"]) and _usable(spec["name"]))
    ]


def start(directory: Path, config: Path) -> str:
    """Start the double unless it already runs with the same options and code; print what was done."""
    directory.mkdir(parents=True, exist_ok=True)
    opts = json.loads(config.read_text())["double"]
    hook_cmd = f"{sys.executable} {Path(__file__).resolve()} hook --config {config.resolve()}"
    argv = [sys.executable, str(HERE / "pve_api.py"), "--hook", hook_cmd]
    for key, val in opts.items():  # a list is a repeated option (--token-acl)
        argv += [a for v in (val if isinstance(val, list) else [val]) for a in (f"--{key}", str(v))]
    code = "".join((HERE / n).read_text() for n in ("pve_api.py", "pve_api_schema.py", "pve_api_lab.py"))
    digest = hashlib.sha256((json.dumps(argv) + code).encode()).hexdigest()
    pidfile, sumfile = directory / "double.pid", directory / "double.sha256"
    lab, state_path = json.loads(config.read_text()), Path(opts["state"])
    lost = lost_cts(lab, state_path)
    if not lost and _alive(pidfile) and sumfile.exists() and sumfile.read_text() == digest:
        return "running"
    stop(directory)  # the double holds its state in memory: change the file only while it is down
    for pid in other_doubles(int(opts["port"])):  # one lab per machine: its containers are ours now
        print(f"stopping another lab's API double (pid {pid}) on port {opts['port']}", file=sys.stderr)
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.1)
    mark_stopped(state_path, lost)
    with (directory / "double.log").open("ab") as log:
        proc = subprocess.Popen(  # close_fds: the daemon must not inherit a caller's lock (flock bin/lab)
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True, start_new_session=True
        )
    pidfile.write_text(str(proc.pid))
    sumfile.write_text(digest)
    time.sleep(0.5)
    if proc.poll() is not None:
        tail = (directory / "double.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(
            f"the Proxmox API double exited at once (is port {opts.get('port')} held by another lab's "
            f"double? `bin/lab down` in that checkout stops it): {' | '.join(tail)}"
        )
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


def kill_unit(name: str, unit: str) -> str:
    """SIGKILL every process of systemd unit `unit` in container `name`, as when its host dies; the unit's
    main process last. (systemd in a container on a cgroup v1 host, as this machine may be, hears no
    cgroup-empty event: a unit whose main process died while the others still lived would stay
    "deactivating" until its stop timeout; with the others gone first, the main process's exit ends it.)"""
    script = (
        'u="$1"; main=$(systemctl show -p MainPID --value "$u"); '
        'cg=$(systemctl show -p ControlGroup --value "$u"); '
        'procs=$(cat /sys/fs/cgroup/systemd"$cg"/cgroup.procs /sys/fs/cgroup"$cg"/cgroup.procs 2>/dev/null '
        '|| true); '
        'for p in $procs; do [ "$p" = "$main" ] || kill -9 "$p" 2>/dev/null || true; done; sleep 1; '
        '[ "$main" = 0 ] || kill -9 "$main" 2>/dev/null || true; echo "$main $procs"'
    )
    out = _podman("exec", name, "sh", "-c", script, "sh", unit).stdout.split()
    return f"{unit} on {name}: killed {len(set(out[1:]))} process(es), main {out[0] if out else '?'} last"


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
    r = sub.add_parser("prune")
    r.add_argument("names", nargs="+")
    d = sub.add_parser("boot")
    d.add_argument("name")
    k = sub.add_parser("kill-unit")
    k.add_argument("name")
    k.add_argument("unit")
    n = sub.add_parser("nodes")
    n.add_argument("dir", type=Path)
    n.add_argument("--gpus", type=int, default=2)
    a = ap.parse_args()
    if a.cmd == "hook":
        return hook(a.config, a.event, a.vmid)
    if a.cmd == "prune":
        print(" ".join(prune(a.names)))
        return 0
    if a.cmd == "boot":  # a container whose systemd exited at its first start: its cgroup was not its own
        _podman("stop", "-t", "0", a.name, check=False)
        start_ct(a.name, id_map({"unprivileged": 1}))
        return 0
    if a.cmd == "kill-unit":
        print(kill_unit(a.name, a.unit))
        return 0
    if a.cmd == "nodes":
        print(" ".join(str(p) for p in make_nodes(a.dir, a.gpus)))
        return 0
    print(start(a.dir, a.config) if a.cmd == "start" else stop(a.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
