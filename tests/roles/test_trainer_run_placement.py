"""Role trainer_run, several hosts as one run: each host's train.placement (nnodes, node_rank, the rendezvous)
comes from the inventory, and the NCCL interface from its variables. The filter is called directly with
inventories of 1, 2 and 4 hosts; one real ansible-playbook run of the role's overrides step on two hosts
checks that each node's overrides file is what the trainer's loader accepts."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "trainer_run"


@pytest.fixture(scope="module")
def flt() -> ModuleType:
    path = ROLE / "filter_plugins" / "trainer_run.py"
    spec = importlib.util.spec_from_file_location("trainer_run_filters", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hostvars(*names: str, **addresses: str) -> dict[str, dict[str, str]]:
    return {n: ({"ansible_host": addresses[n]} if n in addresses else {}) for n in names}


def test_one_host_keeps_the_run_files_placement(flt: ModuleType) -> None:
    assert flt.placement(["ct200"], _hostvars("ct200", ct200="10.0.0.5"), "ct200") == {}
    assert flt.placement(["ct200"], _hostvars("ct200"), "ct200", 29500, "", 1) == {}


def test_two_hosts_meet_at_the_first_hosts_address(flt: ModuleType) -> None:
    hosts = ["pve1-ct200", "pve2-ct200"]
    hv = _hostvars(*hosts, **{"pve1-ct200": "10.0.1.10", "pve2-ct200": "10.0.1.11"})
    got = [flt.placement(hosts, hv, me, 29500) for me in hosts]
    assert got == [
        {"train": {"placement": {"nnodes": 2, "node_rank": r, "rdzv_endpoint": "10.0.1.10:29500"}}}
        for r in (0, 1)
    ]
    # a run file that already says 2 nodes is fine; an explicit address and port win
    got = flt.placement(hosts, hv, "pve2-ct200", 29611, "192.168.50.1", 2)
    assert got["train"]["placement"] == {"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "192.168.50.1:29611"}


def test_four_hosts_rank_in_inventory_order(flt: ModuleType) -> None:
    hosts = ["n3", "n1", "n4", "n2"]  # inventory order, not sorted
    hv = _hostvars(*hosts)  # no ansible_host: the first host's name is its address
    ranks = {me: flt.placement(hosts, hv, me)["train"]["placement"] for me in hosts}
    assert [ranks[h]["node_rank"] for h in hosts] == [0, 1, 2, 3]
    assert {p["nnodes"] for p in ranks.values()} == {4}
    assert {p["rdzv_endpoint"] for p in ranks.values()} == {"n3:29500"}
    # stable: the same inventory gives the same ranks
    assert ranks == {me: flt.placement(hosts, hv, me)["train"]["placement"] for me in hosts}


def test_an_ipv6_rendezvous_is_bracketed_as_torchrun_reads_it(flt: ModuleType) -> None:
    hv = _hostvars("a", "b", a="fd00::10")
    assert flt.placement(["a", "b"], hv, "b")["train"]["placement"]["rdzv_endpoint"] == "[fd00::10]:29500"


def test_a_run_file_nnodes_that_is_not_the_number_of_hosts_is_refused(flt: ModuleType) -> None:
    one = r"asks train.placement.nnodes=2 but the play has 1 host\(s\) \(ct200\)"
    with pytest.raises(flt.PlacementError, match=one):
        flt.placement(["ct200"], _hostvars("ct200"), "ct200", 29500, "", 2)
    with pytest.raises(flt.PlacementError, match=r"nnodes=4 but the play has 2 host\(s\) \(a, b\)"):
        flt.placement(["a", "b"], _hostvars("a", "b"), "a", 29500, "", 4)


def test_unreachable_rendezvous_bad_port_and_stranger_are_refused(flt: ModuleType) -> None:
    for addr in ("127.0.0.1", "localhost", "::1"):
        with pytest.raises(flt.PlacementError, match=r"loopback address, which the other 1 host\(s\) cannot"):
            flt.placement(["a", "b"], _hostvars("a", "b", a=addr), "b")
    for port in (0, 70000, True):
        with pytest.raises(flt.PlacementError, match=r"trainer_run_rdzv_port=.* is not a TCP port"):
            flt.placement(["a", "b"], _hostvars("a", "b", a="10.0.0.1"), "a", port)
    with pytest.raises(flt.PlacementError, match=r"host c is not one of the run's hosts \(a, b\)"):
        flt.placement(["a", "b"], _hostvars("a", "b", a="10.0.0.1"), "c")


def test_nccl_env_only_what_is_set(flt: ModuleType) -> None:
    assert flt.nccl_env("", "") == {}
    assert flt.nccl_env("eth1", "") == {"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"}
    assert flt.nccl_env("", "mlx5_0,mlx5_1") == {"NCCL_IB_HCA": "mlx5_0,mlx5_1"}
    # NCCL's exact match is gloo's plain name; an exclusion list is NCCL's alone
    assert flt.nccl_env("=eth1")["GLOO_SOCKET_IFNAME"] == "eth1"
    assert flt.nccl_env("^docker,lo") == {"NCCL_SOCKET_IFNAME": "^docker,lo"}
    with pytest.raises(flt.PlacementError, match="trainer_run_nccl_socket_ifname='eth1 eth2' has whitespace"):
        flt.nccl_env("eth1 eth2")


_PLAY = """
- name: Compose each node's overrides as role trainer_run does (controller only)
  hosts: all
  connection: local
  gather_facts: false
  tasks:
    - name: Resolve the run with the trainer
      ansible.builtin.include_role:
        name: {role}
        tasks_from: resolve
        public: true
    - name: Compose its overrides and check the run as the node gets it
      ansible.builtin.include_role:
        name: {role}
        tasks_from: overrides
        public: true
    - name: Write the overrides file the node gets
      ansible.builtin.copy:
        content: "{{{{ _trainer_run_overrides_text }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.yml"
        mode: "0644"
"""


def _compose(tmp_path: Path, run: str, hosts: dict[str, str]) -> subprocess.CompletedProcess[str]:
    runs, out = tmp_path / "runs", tmp_path / "out"
    runs.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    (runs / "mn.yml").write_text(run)
    inv = {"all": {"hosts": {h: ({"ansible_host": a} if a else {}) for h, a in hosts.items()}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv, sort_keys=False))
    (tmp_path / "play.yml").write_text(_PLAY.format(role=ROLE, out=out))
    extra = {"trainer_run_name": "mn", "trainer_run_runs_dir": str(runs),
             "ansible_python_interpreter": sys.executable}
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    return subprocess.run(
        [exe, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"), "-e", json.dumps(extra)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


_RUN = "name: mn\nstages: [train]\ntarget: {path: /models/tiny}\n"


@pytest.mark.slow
def test_each_node_gets_its_rank_in_an_overrides_file_the_trainer_loads(tmp_path: Path) -> None:
    r = _compose(tmp_path, _RUN, {"pve1-ct200": "10.0.1.10", "pve2-ct200": "10.0.1.11"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    probe = (
        "import sys; from trainer.config import load_run_config;"
        "p = load_run_config(sys.argv[1], override_files=[sys.argv[2]]).train.placement;"
        "print(p.nnodes, p.node_rank, p.rdzv_endpoint)"
    )
    for rank, host in enumerate(("pve1-ct200", "pve2-ct200")):
        text = (tmp_path / "out" / f"{host}.yml").read_text()
        assert yaml.safe_load(text)["train"]["placement"]["node_rank"] == rank
        files = [str(tmp_path / "runs" / "mn.yml"), str(tmp_path / "out" / f"{host}.yml")]
        got = subprocess.run(
            [sys.executable, "-c", probe, *files],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        assert got.returncode == 0, got.stderr
        assert got.stdout.split() == ["2", str(rank), "10.0.1.10:29500"]


@pytest.mark.slow
def test_one_host_adds_no_placement_and_a_mismatch_is_refused_before_any_file(tmp_path: Path) -> None:
    r = _compose(tmp_path, _RUN, {"ct200": "10.0.1.10"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    text = (tmp_path / "out" / "ct200.yml").read_text()
    assert "train" not in (yaml.safe_load(text) or {}), text
    shutil.rmtree(tmp_path / "out")
    run = _RUN + "train: {placement: {nnodes: 2}}\n"
    r = _compose(tmp_path, run, {"ct200": "10.0.1.10"})
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0
    assert "asks train.placement.nnodes=2 but the play has 1 host(s) (ct200)" in out, out[-3000:]
    assert not list((tmp_path / "out").iterdir())
