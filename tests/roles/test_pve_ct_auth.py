"""Role pve_ct against the Proxmox API double with real PVE's permission rules (pve-container
src/PVE/LXC.pm check_ct_modify_config_perm): only the literal root@pam may set bind mounts, devN and the
features of a privileged container; an API token (root@pam!NAME) is refused them with HTTP 403 and
pve-container's message. The shipped design (the token for the rest, `pct set` on the host as root for those
keys, here the pct stand-in that reaches the double as root@pam) gets through."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException
from pve_run import PveDouble, bind_source, default_state, fake_gpu_dev, run_role


@pytest.fixture()
def pve(tmp_path: Path) -> Iterator[PveDouble]:
    double = PveDouble(tmp_path / "pve")
    double.start()
    try:
        yield double
    finally:
        double.stop()


def role_vars(pve: PveDouble, dev: Path, **extra: Any) -> dict[str, Any]:
    return {
        **pve.role_vars(),
        "pve_ct_host_dev_dir": str(dev),
        "pve_ct_rootfs_storage": "scratch",
        "pve_ct_verify_gpus": False,
        "pve_ct_bind_mounts": [{"host_path": str(bind_source(dev.parent)), "mount_point": "/workspace"}],
        **extra,
    }


def token_api(pve: PveDouble) -> ProxmoxAPI:
    return ProxmoxAPI(
        "127.0.0.1",
        port=pve.port,
        user="root@pam",
        token_name="ansible",
        token_value=pve.token.rpartition("=")[2],
        verify_ssl=str(pve.ca),
    )


ROOT_ONLY = re.compile(r"^(mp\d+|dev\d+)$")


def test_a_pct_that_fails_stops_the_role_naming_it_and_the_ct_is_not_started(
    pve: PveDouble, tmp_path: Path
) -> None:
    """pct fails as a real one does on an API error (its message on stderr, exit 255; here the double's
    root login is refused): the role stops at the pct task with that message, CT 200 exists with what the
    token set and is not started; the next run, with pct working, sets the keys and starts it."""
    dev = fake_gpu_dev(tmp_path / "dev")
    good = json.loads(pve.pct_config.read_text())
    pve.pct_config.write_text(json.dumps({**good, "password": "not-root-s-password"}))
    res = run_role(tmp_path / "run", role_vars(pve, dev))
    assert res.rc != 0
    assert any(
        "Refuse a pct set that failed" in f and "401 authentication failure" in f for f in res.failures
    ), res.failures
    ct = pve.state()["cts"]["200"]
    assert ct["status"] == "stopped" and not [k for k in ct["config"] if ROOT_ONLY.match(k)]
    pve.pct_config.write_text(json.dumps(good))
    again = run_role(tmp_path / "run", role_vars(pve, dev))
    assert again.rc == 0, again.failures
    ct = pve.state()["cts"]["200"]
    assert ct["status"] == "running" and "mp0" in ct["config"] and "dev0" in ct["config"]


def test_check_mode_reports_the_root_only_keys_and_changes_nothing(pve: PveDouble, tmp_path: Path) -> None:
    dev = fake_gpu_dev(tmp_path / "dev")
    first = run_role(tmp_path / "run", role_vars(pve, dev))
    assert first.rc == 0, first.failures
    pve.clear_log()
    more = fake_gpu_dev(tmp_path / "dev", gpus=9)  # a ninth GPU appears: one devN more to set
    res = run_role(tmp_path / "check", role_vars(pve, more), check=True)
    assert res.rc == 0, res.failures
    assert "Create or converge the container and bring it to its run state" in res.changed_tasks
    assert [r for r in pve.requests() if r["method"] != "GET" and "ticket" not in r["path"]] == []
    assert "/dev/nvidia8" not in json.dumps(pve.state()["cts"]["200"]["config"])


def test_double_enforces_pve_rules_by_user_and_key(pve: PveDouble) -> None:
    """Directly through proxmoxer: the token may create an unprivileged CT with nesting, not a privileged
    CT with features, not features other than nesting, not devN; root@pam's ticket may."""
    api = token_api(pve)
    api.nodes("pve1").aplinfo.post(storage="local", template="debian-12-standard_12.12-1_amd64.tar.zst")
    tmpl = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"
    api.nodes("pve1").lxc.post(
        vmid=301, ostemplate=tmpl, rootfs="scratch:4", features="nesting=1", unprivileged=1
    )
    cases = [
        (
            dict(vmid=302, unprivileged=0, features="nesting=1"),
            "changing feature flags for privileged container is only allowed for root@pam",
        ),
        (
            dict(vmid=303, unprivileged=1, features="nesting=1,keyctl=1"),
            "changing feature flags (except nesting) is only allowed for root@pam",
        ),
        (dict(vmid=304, dev0="/dev/nvidia0"), "configuring device passthrough is only allowed for root@pam"),
        (dict(vmid=305, mp0="/tank,mp=/tank"), "mount point type bind is only allowed for root@pam"),
    ]
    for params, why in cases:
        with pytest.raises(ResourceException) as err:
            api.nodes("pve1").lxc.post(ostemplate=tmpl, rootfs="scratch:4", **params)
        assert err.value.status_code == 403 and f"Permission check failed ({why})" in str(err.value), params
    with pytest.raises(ResourceException) as err:
        api.nodes("pve1").lxc(301).config.put(dev0="/dev/nvidia0")
    assert err.value.status_code == 403
    root = ProxmoxAPI(
        "127.0.0.1", port=pve.port, user="root@pam", password=pve.root_password, verify_ssl=str(pve.ca)
    )
    root.nodes("pve1").lxc(301).config.put(
        dev0="/dev/nvidia0", mp0="/tank,mp=/tank", features="nesting=1,keyctl=1"
    )
    cfg = root.nodes("pve1").lxc(301).config.get()
    assert cfg["dev0"] == "/dev/nvidia0" and cfg["mp0"] == "/tank,mp=/tank"
    with pytest.raises(ResourceException) as err:  # the token may not delete a devN either (line 1687)
        api.nodes("pve1").lxc(301).config.put(delete="dev0")
    assert err.value.status_code == 403
    with pytest.raises(Exception, match="401"):
        ProxmoxAPI("127.0.0.1", port=pve.port, user="root@pam", password="wrong", verify_ssl=str(pve.ca))


@pytest.mark.parametrize("pve_version", ["8.4.1", "9.0.10"])
def test_shipped_design_creates_ct200_then_changes_nothing(tmp_path: Path, pve_version: str) -> None:
    """Token + `pct set`, on Proxmox VE 8 and 9: CT 200, unprivileged, 8 GPUs as devN (group video, 0660),
    /workspace bind-mounted, nesting on; the token did the create (nesting included: a token may set it on
    an unprivileged CT) and pct set only the root-only keys; a second run changes nothing."""
    state = default_state("pve1")
    state["version"] = {"version": pve_version, "release": pve_version.rsplit(".", 1)[0], "repoid": "0"}
    pve = PveDouble(tmp_path / "pve")
    pve.state_path.parent.mkdir(parents=True, exist_ok=True)
    pve.state_path.write_text(json.dumps(state))
    pve.start()
    try:
        _shipped_design(pve, tmp_path)
    finally:
        pve.stop()


def _shipped_design(pve: PveDouble, tmp_path: Path) -> None:
    dev = fake_gpu_dev(tmp_path / "dev")
    first = run_role(tmp_path / "one", role_vars(pve, dev))
    assert first.rc == 0, first.failures
    cfg = pve.state()["cts"]["200"]["config"]
    assert cfg["mp0"] == f"{bind_source(dev.parent)},mp=/workspace" and cfg["features"] == "nesting=1"
    assert cfg["unprivileged"] == 1
    devs = sorted(v for k, v in cfg.items() if k.startswith("dev"))
    gpus = [d for d in devs if re.fullmatch(r"/dev/nvidia\d+,.*", d)]
    assert gpus == [f"/dev/nvidia{i},gid=44,mode=0660" for i in range(8)]
    log = pve.requests()
    create = next(r for r in log if r["method"] == "POST" and r["path"] == "/api2/json/nodes/pve1/lxc")
    assert not any(k.startswith(("dev", "mp")) for k in create["params"]), create["params"]
    assert create["params"]["features"] == "nesting=1" and create["params"]["unprivileged"] in ("1", 1)
    # the token never sent a root-only key; pct (root@pam) sent them, and nothing else
    token_sent = [k for r in log if r.get("user") != "root@pam" for k in r["params"] if ROOT_ONLY.match(k)]
    assert token_sent == []
    root_put = [r for r in log if r.get("user") == "root@pam" and r["method"] != "GET"]
    assert len(root_put) == 1 and root_put[0]["path"].endswith("/lxc/200/config"), root_put
    assert {"mp0", "dev0"} <= set(root_put[0]["params"]) and "features" not in root_put[0]["params"]
    assert all(r["status"] == 200 for r in log), [r for r in log if r["status"] != 200]
    second = run_role(tmp_path / "two", role_vars(pve, dev))
    assert second.rc == 0 and second.changed == 0, second.changed_tasks


# What a token of root@pam with privilege separation needs for CT 200 (roles/pve_ct/vars/main.yml).
NEEDED = {
    "/vms/200": [
        "VM.Allocate",
        "VM.Audit",
        "VM.PowerMgmt",
        "VM.Config.CPU",
        "VM.Config.Memory",
        "VM.Config.Network",
        "VM.Config.Options",
        "VM.Config.Disk",
    ],
    "/storage/scratch": ["Datastore.AllocateSpace"],
    "/storage/local": ["Datastore.Audit", "Datastore.AllocateTemplate"],
    "/sdn/zones/localnetwork/vmbr0": ["SDN.Use"],
    "/": ["Sys.Modify"],
}


def test_privsep_token_without_acls_is_refused_before_any_change(tmp_path: Path) -> None:
    """`pveum user token add root@pam ansible` (privsep on, the default) with no ACL: the role stops at
    its preflight, naming every missing privilege and the fixes; nothing is written."""
    pve = PveDouble(tmp_path / "pve", token_privsep=True)
    pve.start()
    try:
        res = run_role(tmp_path / "run", role_vars(pve, fake_gpu_dev(tmp_path / "dev")))
        assert res.rc != 0
        fail = " ".join(res.failures)
        assert "lacks Proxmox privileges" in fail and "/vms/200: VM.Allocate" in fail, res.failures
        assert "/storage/scratch: Datastore.AllocateSpace" in fail
        assert "Sys.Modify" not in fail  # only a privileged CT needs it (API2/LXC.pm 273)
        assert "--privsep 0" in fail and "pveum acl modify" in fail
        assert not [r for r in pve.requests() if r["method"] != "GET" and "ticket" not in r["path"]]
    finally:
        pve.stop()


def test_double_refuses_a_privsep_token_as_pve_does(tmp_path: Path) -> None:
    """Without the preflight the create itself fails: the double checks the schema's and the code's
    privileges for a privsep token, with Proxmox's 403 message, and answers /access/permissions."""
    pve = PveDouble(
        tmp_path / "pve", token_privsep=True, token_acl={"/storage": ["Datastore.AllocateTemplate"]}
    )
    pve.start()
    try:
        api = token_api(pve)
        assert api.access.permissions.get(path="/vms/200") == {}
        assert api.access.permissions.get(path="/storage/local") == {
            "/storage/local": {"Datastore.AllocateTemplate": 1}
        }
        api.nodes("pve1").aplinfo.post(storage="local", template="debian-12-standard_12.12-1_amd64.tar.zst")
        with pytest.raises(ResourceException) as err:  # GET content needs Audit or AllocateSpace (any)
            api.nodes("pve1").storage("local").content.get(content="vztmpl")
        assert err.value.status_code == 403
        assert "Permission check failed (/storage/local, Datastore.Audit|Datastore.AllocateSpace)" in str(
            err.value
        )
        tmpl = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"
        with pytest.raises(ResourceException) as err:
            api.nodes("pve1").lxc.post(vmid=200, ostemplate=tmpl, rootfs="scratch:4", unprivileged=1)
        assert err.value.status_code == 403 and "(/vms/200, VM.Allocate)" in str(err.value)
        assert "200" not in pve.state()["cts"]
    finally:
        pve.stop()


def test_privsep_token_with_the_privileges_it_needs_creates_ct200(tmp_path: Path) -> None:
    """The same token with ACLs granting what the role checks (and the bridge and template privileges
    Proxmox checks in its code) gets through, first run and second run."""
    pve = PveDouble(tmp_path / "pve", token_privsep=True, token_acl=NEEDED)
    pve.start()
    try:
        dev = fake_gpu_dev(tmp_path / "dev")
        first = run_role(tmp_path / "run", role_vars(pve, dev))
        assert first.rc == 0, first.failures
        assert pve.state()["cts"]["200"]["status"] == "running"
        second = run_role(tmp_path / "run", role_vars(pve, dev))
        assert second.rc == 0 and second.changed == 0, second.changed_tasks
        # one privilege fewer, and the preflight names exactly it
        pve.stop()
        pve.token_acl = {**NEEDED, "/vms/200": [p for p in NEEDED["/vms/200"] if p != "VM.PowerMgmt"]}
        pve.start()
        third = run_role(tmp_path / "run", role_vars(pve, dev))
        assert third.rc != 0
        assert any("/vms/200: VM.PowerMgmt." in f for f in third.failures), third.failures
    finally:
        pve.stop()
