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
    sys.exit(0)
if args[:2] == ["rm", "-f"]:
    cts.pop(args[2], None); save(); sys.exit(0)
if args[0] == "start":
    save(); sys.exit(0)  # "Up" already: podman does nothing, the dead processes stay dead
if args[:2] == ["run", "-d"]:
    name = args[args.index("--name") + 1]
    if name in cts:
        print(f"Error: the container name \"{name}\" is already in use", file=sys.stderr)
        save(); sys.exit(125)
    cts[name] = {"alive": True, "argv": args}; save(); sys.exit(0)
if args[0] == "inspect":
    save(); print(json.dumps([{"Source": "/srv/x", "Destination": "/srv/lab"}])); sys.exit(0)
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


def _hook(cfg: Path, event: str, vmid: str = "200") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LAB), "hook", "--config", str(cfg), event, vmid],
        input=json.dumps({"hostname": "ct200"}),
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
    assert any(c[:2] == ["run", "-d"] for c in db["calls"])


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
