"""The lab's Proxmox hook (tests/doubles/pve_api_lab.py) against leftovers of earlier labs.

podman itself is replaced by a small fake on PATH that keeps its containers in a JSON file and answers
the few commands the hook uses the way podman 4/5 does, including the case that broke CI: a container
whose processes died with an earlier session still reads as existing, `podman start` on it succeeds
and does nothing, and `podman exec` fails with "cannot exec in a stopped container" (runc's message).
Running real podman containers here is what the lab stage does; this test pins the recovery logic.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests" / "doubles" / "pve_api_lab.py"

FAKE_PODMAN = r"""#!/usr/bin/env python3
import json, os, sys
db = os.environ["FAKE_PODMAN_DB"]
state = json.load(open(db))
args = sys.argv[1:]
state["calls"].append(args)
def save():
    json.dump(state, open(db, "w"))
cts = state["containers"]
if args[:2] == ["container", "exists"]:
    save(); sys.exit(0 if args[2] in cts else 1)
if args[0] == "exec":
    name = args[1]
    save()
    if name not in cts:
        print(f"Error: no container with name or ID \"{name}\" found: no such container", file=sys.stderr)
        sys.exit(125)
    if not cts[name]["alive"]:
        msg = "Error: OCI runtime error: runc: exec failed: cannot exec in a stopped container"
        print(msg, file=sys.stderr)
        sys.exit(126)
    if args[2:4] == ["systemctl", "is-system-running"]:
        print("running")
    if args[2] == "stat":  # the Proxmox host's node: a character device 195:N, as `stat -c '%f %t %T'`
        print(f"21b6 c3 {int(args[-1].rsplit('nvidia', 1)[1]):x}")
    sys.exit(0)
if args[:2] == ["rm", "-f"]:
    cts.pop(args[2], None); save(); sys.exit(0)
if args[0] == "start":
    save(); sys.exit(0)  # "Up" already: podman does nothing, the dead processes stay dead
if args[0] == "init":
    save(); sys.exit(0)
if args[0] == "create":
    name = args[args.index("--name") + 1]
    if name in cts:
        print(f"Error: the container name \"{name}\" is already in use", file=sys.stderr)
        save(); sys.exit(125)
    cts[name] = {"alive": True, "argv": args}; save(); sys.exit(0)
if args[0] == "inspect":
    save()
    if "{{.Id}}" in args:
        print("f" * 64); sys.exit(0)
    print(json.dumps([{"Source": "/srv/x", "Destination": "/srv/lab"}])); sys.exit(0)
print("fake podman: unexpected " + " ".join(args), file=sys.stderr); sys.exit(2)
"""


@pytest.fixture
def podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "podman"
    exe.write_text(FAKE_PODMAN)
    exe.chmod(0o755)
    db = tmp_path / "podman.json"

    def set_containers(containers: dict) -> None:
        db.write_text(json.dumps({"containers": containers, "calls": []}))

    def read() -> dict:
        return json.loads(db.read_text())

    set_containers({})
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PODMAN_DB", str(db))
    return set_containers, read


@pytest.fixture
def lab_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "lab.json"
    spec = {"name": "lab-ct200", "image": "img", "network": "gpu-lab", "host": "lab-pve", "setup": "true"}
    cfg.write_text(json.dumps({"double": {"state": str(tmp_path / "state.json")}, "cts": {"200": spec}}))
    return cfg


def _hook(
    cfg: Path, event: str, vmid: str = "200", ct: dict | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LAB), "hook", "--config", str(cfg), event, vmid],
        input=json.dumps(ct or {"hostname": "ct200"}),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _module():
    spec = importlib.util.spec_from_file_location("pve_api_lab", LAB)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_create_removes_a_leftover_container_of_the_ct_name(podman, lab_config: Path) -> None:
    set_containers, read = podman
    set_containers({"lab-ct200": {"alive": True, "argv": ["from", "another", "checkout"]}})
    assert _hook(lab_config, "vzcreate").returncode == 0
    assert "lab-ct200" not in read()["containers"]
    proc = _hook(lab_config, "vzstart")
    assert proc.returncode == 0, proc.stderr
    made = read()["containers"]["lab-ct200"]
    assert made["alive"] and "--hostname" in made["argv"] and "ct200" in made["argv"]


def test_start_replaces_a_dead_container_instead_of_waiting_on_it(podman, lab_config: Path) -> None:
    set_containers, read = podman
    set_containers({"lab-ct200": {"alive": False, "argv": []}})
    proc = _hook(lab_config, "vzstart")
    assert proc.returncode == 0, proc.stderr
    db = read()
    assert db["containers"]["lab-ct200"]["alive"]
    assert ["rm", "-f", "lab-ct200"] in db["calls"]
    assert any(c[0] == "create" for c in db["calls"]) and ["start", "lab-ct200"] in db["calls"]


def test_start_of_a_live_container_only_starts_it(podman, lab_config: Path) -> None:
    set_containers, read = podman
    set_containers({"lab-ct200": {"alive": True, "argv": ["kept"]}})
    assert _hook(lab_config, "vzstart").returncode == 0
    db = read()
    assert db["containers"]["lab-ct200"]["argv"] == ["kept"]
    assert ["start", "lab-ct200"] in db["calls"]
    assert not any(c[:2] == ["rm", "-f"] for c in db["calls"])


def test_prune_removes_only_dead_containers(podman) -> None:
    set_containers, read = podman
    set_containers({"lab-pve": {"alive": True, "argv": []}, "lab-b200": {"alive": False, "argv": []}})
    out = subprocess.run(
        [sys.executable, str(LAB), "prune", "lab-pve", "lab-b200", "lab-ct200"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["lab-b200"]
    assert set(read()["containers"]) == {"lab-pve"}


def test_a_running_ct_whose_container_is_gone_is_marked_stopped(podman, lab_config: Path) -> None:
    set_containers, _ = podman
    lab = json.loads(lab_config.read_text())
    state_path = Path(lab["double"]["state"])
    state_path.write_text(json.dumps({"cts": {"200": {"status": "running", "config": {}}}}))
    mod = _module()
    set_containers({"lab-ct200": {"alive": True, "argv": []}})
    assert mod.lost_cts(lab, state_path) == []
    set_containers({"lab-ct200": {"alive": False, "argv": []}})
    assert mod.lost_cts(lab, state_path) == ["200"]
    mod.mark_stopped(state_path, ["200"])
    assert json.loads(state_path.read_text())["cts"]["200"]["status"] == "stopped"
    set_containers({})
    assert mod.lost_cts(lab, state_path) == []  # stopped now: nothing more to reconcile


def test_another_checkouts_double_on_the_port_is_found(tmp_path: Path) -> None:
    fake = tmp_path / "elsewhere" / "pve_api.py"
    fake.parent.mkdir()
    fake.write_text("import time\ntime.sleep(60)\n")
    other = subprocess.Popen([sys.executable, str(fake), "--hook", "x", "--port", "18006"])
    try:
        mod = _module()
        for _ in range(50):
            if mod.other_doubles(18006):
                break
            time.sleep(0.1)
        assert mod.other_doubles(18006) == [other.pid]
        assert mod.other_doubles(18007) == []
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes (mknod) needs root, as on a Proxmox host")
def test_unprivileged_ct_gets_its_id_map_and_gpu_nodes_as_proxmox_makes_them(
    podman, lab_config: Path
) -> None:
    """An unprivileged CT with devN entries, as role pve_ct writes them: the container runs with Proxmox's
    default id map (0-65535 -> 100000-165535), without MKNOD, and each devN becomes a node of the host node's
    type and numbers, mode 0660, owned by the container's root and group 44 (video) mapped to host ids
    100000 and 100044, bind-mounted at its /dev path. Its control group is given to the container's root
    between `podman init` and `podman start`."""
    set_containers, read = podman
    set_containers({"lab-pve": {"alive": True, "argv": []}})  # the Proxmox host, whose /dev holds the GPUs
    ct = {"hostname": "ct200", "unprivileged": 1, "dev0": "/dev/nvidia0,gid=44,mode=0660",
          "dev1": "/dev/nvidia3,gid=44,mode=0660"}
    proc = _hook(lab_config, "vzstart", ct=ct)
    assert proc.returncode == 0, proc.stderr
    db = read()
    argv = db["containers"]["lab-ct200"]["argv"]
    assert argv[0] == "create" and "--cap-add" not in argv
    assert argv[argv.index("--uidmap") + 1] == "0:100000:65536"
    assert argv[argv.index("--gidmap") + 1] == "0:100000:65536"
    made = lab_config.parent / "passthrough" / "200" / "dev"
    for n in (0, 3):
        st = (made / f"nvidia{n}").stat()
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, n)
        assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (100000, 100044, "0o660")
        assert f"{made}/nvidia{n}:/dev/nvidia{n}" in argv
    order = [c[0] for c in db["calls"] if c[0] in ("create", "init", "start")]
    assert order == ["create", "init", "start"]


def test_id_map_and_passthrough_node_follow_pve_container() -> None:
    """The double's id map (parse_id_maps) and node rules (create_passthrough_device_node), on /dev/null's
    real stat: defaults, a custom lxc.idmap, an unmapped id, a path that is not a device."""
    sys.path.insert(0, str(ROOT / "tests" / "doubles"))
    from pve_api import ApiError, id_map, passthrough_node

    assert id_map({"unprivileged": 0}) == []
    assert id_map({"unprivileged": 1}) == [("u", 0, 100000, 65536), ("g", 0, 100000, 65536)]
    custom = {"unprivileged": 1, "lxc": [["lxc.idmap", "u 0 200000 1000"], ["lxc.idmap", "g 0 300000 1000"]]}
    assert id_map(custom) == [("u", 0, 200000, 1000), ("g", 0, 300000, 1000)]
    null = os.stat("/dev/null")
    unpriv = id_map({"unprivileged": 1})
    node = passthrough_node("/dev/null,gid=44,mode=0660", null.st_mode, null.st_rdev, unpriv)
    assert node == {"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "mode": 0o660, "uid": 100000,
                    "gid": 100044, "deny_write": False}
    # defaults: mode 0660, uid and gid 0 (the container's root); privileged: no mapping; an id past the map
    assert passthrough_node("/dev/null", null.st_mode, null.st_rdev, [])["mode"] == 0o660
    assert passthrough_node("/dev/null,uid=70000", null.st_mode, null.st_rdev, id_map(custom))["uid"] == 70000
    with pytest.raises(ApiError, match="is not a device"):
        passthrough_node("/dev/shm", os.stat("/dev/shm").st_mode, 0, [])
    with pytest.raises(ApiError, match="failed to parse idmap"):
        id_map({"lxc": [["lxc.idmap", "u 0 x"]]})


def test_double_refuses_dev_entries_proxmox_refuses() -> None:
    """pve-container's dev format: a path outside /dev/ or with `..`, a mode not 0NNN, a negative gid."""
    sys.path.insert(0, str(ROOT / "tests" / "doubles"))
    from pve_api_schema import ApiError, check_params

    def put(**params: str) -> None:
        where = {"node": "pve1", "vmid": "200"}
        check_params("PUT", "/nodes/pve1/lxc/200/config", "lxc_config_put", where, params)

    put(dev0="/dev/nvidia0,gid=44,mode=0660", dev1="/dev/nvidia-caps/nvidia-cap1,uid=0,deny-write=1")
    for bad, why in [
        ("/srv/lab/dev/nvidia0,mode=0660", "is not a valid device path"),
        ("/dev/../etc/shadow", "is not a valid device path"),
        ("/dev/nvidia0,mode=660", "mode: value does not match the regex pattern"),
        ("/dev/nvidia0,gid=-1", "gid: type check ('integer') failed"),
        ("/dev/nvidia0,colour=red", "colour: property is not defined"),
    ]:
        with pytest.raises(ApiError) as err:
            put(dev0=bad)
        assert why in json.dumps(err.value.errors), (bad, err.value.errors)
