"""Role pve_ct against the Proxmox API double, through the real ansible-playbook, proxmoxer and
community.proxmox modules. A real Proxmox VE cannot run here: tests/doubles/pve_api.py stands in for it
(HTTPS on loopback with a test-only CA, API-token auth, real UPIDs and task states, parameter checks), and
every request the role sent is checked against the real API schema when it is present
(tests/roles/pve_schema.py says where it is looked for)."""

from __future__ import annotations

import grp
import json
import os
import pwd
from pathlib import Path
from typing import Any

import pytest
from pve_run import PlayResult, PveDouble, bind_source, default_state, fake_gpu_dev, run_role, wait_task
from pve_schema import APIDATA, request_errors

WRITES = {"POST", "PUT", "DELETE"}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPvDhQ2ctestkey trainer@laptop"


@pytest.fixture(scope="module")
def gpu_dev(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_gpu_dev(tmp_path_factory.mktemp("dev"))


def base_vars(pve: PveDouble, gpu_dev: Path, **extra: Any) -> dict[str, Any]:
    return {
        **pve.role_vars(),
        "pve_ct_host_dev_dir": str(gpu_dev),
        "pve_ct_rootfs_storage": "scratch",
        "pve_ct_rootfs_size_gb": 400,
        "pve_ct_cores": 64,
        "pve_ct_memory_mb": 524288,
        "pve_ct_verify_gpus": False,
        "pve_ct_ssh_public_keys": [KEY],
        "pve_ct_bind_mounts": [{"host_path": str(bind_source(gpu_dev.parent)), "mount_point": "/workspace"}],
        **extra,
    }


def writes(requests: list[dict[str, Any]]) -> list[str]:
    """The requests that change something (a ticket login, POST /access/ticket, changes nothing)."""
    return [
        f"{r['method']} {r['path']}"
        for r in requests
        if r["method"] in WRITES and r["path"] != "/api2/json/access/ticket"
    ]


def assert_ok(res: PlayResult) -> None:
    assert res.rc == 0 and not res.failures, f"role failed: {res.failures}\n{res.output[-3000:]}"


@pytest.fixture(scope="module")
def ct200(pve: PveDouble, gpu_dev: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """CT 200 created by a first run; a second run repeated on top. Both runs' requests are kept."""
    work = tmp_path_factory.mktemp("ct200")
    pve.clear_log()
    first = run_role(work, base_vars(pve, gpu_dev))
    first_requests = pve.requests()
    pve.clear_log()
    second = run_role(work, base_vars(pve, gpu_dev))
    return {
        "first": first,
        "second": second,
        "first_requests": first_requests,
        "second_requests": pve.requests(),
        "state": pve.state(),
    }


@pytest.mark.slow
def test_first_run_creates_ct200_with_all_gpus(ct200: dict[str, Any], gpu_dev: Path) -> None:
    assert_ok(ct200["first"])
    assert ct200["first"].changed >= 2  # template + container
    ct = ct200["state"]["cts"]["200"]
    cfg = ct["config"]
    assert ct["status"] == "running"
    assert cfg["rootfs"].startswith("scratch:subvol-200-disk-0") and cfg["rootfs"].endswith("size=400G")
    assert (cfg["cores"], cfg["memory"], cfg["features"], cfg["onboot"]) == (64, 524288, "nesting=1", 1)
    assert cfg["mp0"] == f"{bind_source(gpu_dev.parent)},mp=/workspace"
    assert ct["ssh_keys"].strip() == KEY
    assert cfg["tags"] == "dflash"  # the mark that lets later runs converge it
    assert cfg["unprivileged"] == 1  # the default: root in CT 200 is host uid 100000
    devs = sorted((v for k, v in cfg.items() if k.startswith("dev")), key=str)
    # the host's nodes by their /dev path (the only paths Proxmox accepts), group video (44), mode 0660
    want = [f"/dev/nvidia{i}" for i in range(8)]
    want += [f"/dev/{n}" for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")]
    assert devs == sorted((f"{w},gid=44,mode=0660" for w in want), key=str)
    volids = [v["volid"] for v in ct200["state"]["storage"]["local"]["volumes"]]
    assert "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst" in volids
    assert writes(ct200["first_requests"]).count("POST /api2/json/nodes/pve1/lxc") == 1


@pytest.mark.slow
def test_second_run_changes_nothing(ct200: dict[str, Any]) -> None:
    assert_ok(ct200["second"])
    assert ct200["second"].changed == 0, ct200["second"].changed_tasks
    assert writes(ct200["second_requests"]) == []


@pytest.mark.slow
def test_every_request_is_valid_for_the_real_api(ct200: dict[str, Any]) -> None:
    """Each request the role sent is checked against the real schema (pve-apidata.json, when present next to
    the repository; the double's own parameter checks, which answered every request, apply either way)."""
    requests = ct200["first_requests"] + ct200["second_requests"]
    assert len(requests) > 20
    assert all(r["status"] == 200 for r in requests), [r for r in requests if r["status"] != 200]
    if APIDATA.exists():
        errors = [e for r in requests for e in request_errors(r)]
        assert errors == []


def test_schema_check_can_fail() -> None:
    """The schema checker rejects what the real API would (so the check above can fail)."""
    if not APIDATA.exists():  # the schema is not part of this repository: checked when present
        pytest.skip(f"{APIDATA} not present (set PVE_APIDATA to the real API schema to run this check)")
    bad = {
        "method": "PUT",
        "path": "/api2/json/nodes/pve1/lxc/200/config",
        "params": {"ssh-public-keys": "x", "dev0": "/dev/nvidia0,colour=red", "cores": "many"},
    }
    errors = " ".join(request_errors(bad))
    assert "'ssh-public-keys' is not defined" in errors
    assert "colour" in errors and "cores='many'" in errors


@pytest.mark.slow
def test_gpu_subset_check_mode_then_apply(
    ct200: dict[str, Any], pve: PveDouble, gpu_dev: Path, tmp_path: Path
) -> None:
    before = pve.state()["cts"]["200"]["config"]
    pve.clear_log()
    dry = run_role(tmp_path, base_vars(pve, gpu_dev, pve_ct_gpus=[1, 3]), check=True)
    assert_ok(dry)
    assert "Create or converge the container and bring it to its run state" in dry.changed_tasks
    assert '"dev5"' in dry.output or "dev5" in dry.output  # the diff shows entries that would go
    assert writes(pve.requests()) == []
    assert pve.state()["cts"]["200"]["config"] == before

    pve.clear_log()
    applied = run_role(tmp_path, base_vars(pve, gpu_dev, pve_ct_gpus=[1, 3]))
    assert_ok(applied)
    cfg = pve.state()["cts"]["200"]["config"]
    devs = {k: v.split(",")[0] for k, v in cfg.items() if k.startswith("dev")}
    assert devs == {
        "dev0": "/dev/nvidia1",
        "dev1": "/dev/nvidia3",
        "dev2": "/dev/nvidiactl",
        "dev3": "/dev/nvidia-uvm",
        "dev4": "/dev/nvidia-uvm-tools",
    }
    sent = writes(pve.requests())
    assert "POST /api2/json/nodes/pve1/lxc/200/status/stop" in sent  # devN apply at the next start
    assert sent[-1] == "POST /api2/json/nodes/pve1/lxc/200/status/start"
    put = next(r for r in pve.requests() if r["method"] == "PUT")
    assert set(put["params"]["delete"].split(",")) == {f"dev{i}" for i in range(5, 11)}

    again = run_role(tmp_path, base_vars(pve, gpu_dev, pve_ct_gpus=[1, 3]))
    assert_ok(again)
    assert again.changed == 0, again.changed_tasks


@pytest.mark.slow
def test_gpu_index_not_on_host_is_refused(
    ct200: dict[str, Any], pve: PveDouble, gpu_dev: Path, tmp_path: Path
) -> None:
    res = run_role(tmp_path, base_vars(pve, gpu_dev, pve_ct_gpus=[0, 9]))
    assert res.rc != 0
    assert any("pve_ct_gpus=[0, 9]" in f and "GPUs [0, 1, 2, 3, 4, 5, 6, 7]" in f for f in res.failures), (
        res.failures
    )


def test_wrong_token_fails_clearly_without_leaking_it(pve: PveDouble, gpu_dev: Path, tmp_path: Path) -> None:
    secret = "not-the-secret-5d1c"
    res = run_role(tmp_path, base_vars(pve, gpu_dev, pve_ct_api_token_secret=secret))
    assert res.rc != 0
    assert any("rejected API token 'root@pam!ansible'" in f and "401" in f for f in res.failures), (
        res.failures
    )
    assert secret not in res.output


def test_tls_is_verified_against_the_configured_ca(pve: PveDouble, gpu_dev: Path, tmp_path: Path) -> None:
    """With no CA path the role fetches the cluster CA (pve_ct_api_ca_src, /etc/pve/pve-root-ca.pem on a real
    host) and verifies against it: another CA there fails verification, the right one passes."""
    from pve_api_fixture import make_ca

    other_ca, _cert, _key = make_ca(tmp_path / "other")
    res = run_role(
        tmp_path / "bad",
        base_vars(
            pve,
            gpu_dev,
            pve_ct_api_ca_path="",
            pve_ct_api_ca_src=str(other_ca),
            pve_ct_api_ca_cache=str(tmp_path / "bad-ca.pem"),
        ),
    )
    assert res.rc != 0
    assert any("TLS verification" in f and "pve_ct_api_ca_path" in f for f in res.failures), res.failures
    good = run_role(
        tmp_path / "good",
        base_vars(
            pve,
            gpu_dev,
            pve_ct_api_ca_path="",
            pve_ct_api_ca_src=str(pve.ca),
            pve_ct_api_ca_cache=str(tmp_path / "good-ca.pem"),
        ),
        check=True,
    )
    assert_ok(good)
    assert (tmp_path / "good-ca.pem").read_text() == pve.ca.read_text()


def test_double_rejects_what_the_real_api_rejects(pve: PveDouble) -> None:
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import ResourceException

    api = ProxmoxAPI(
        "127.0.0.1",
        port=pve.port,
        user="root@pam",
        token_name="ansible",
        token_value=pve.token.rpartition("=")[2],
        verify_ssl=str(pve.ca),
    )
    with pytest.raises(ResourceException) as err:
        api.nodes("pve1").lxc.post(vmid=300, ostemplate="local:vztmpl/none.tar.zst", colour="red")
    assert err.value.status_code == 400 and "colour" in str(err.value.errors)
    with pytest.raises(ResourceException) as err:
        api.nodes("pve1").lxc.post(vmid=300, ostemplate="local:vztmpl/none.tar.zst")
    assert err.value.status_code == 500 and "does not exist" in str(err.value)
    upid = api.nodes("pve1").aplinfo.post(
        storage="local", template="debian-12-standard_12.12-1_amd64.tar.zst"
    )
    assert upid.startswith("UPID:pve1:") and ":download:" in upid
    assert api.nodes("pve1").tasks(upid).status.get()["status"] in {"running", "stopped"}
    state = json.loads(pve.state_path.read_text())
    assert "300" not in state["cts"]


def test_a_missing_bind_source_is_refused_before_anything_is_created(
    pve: PveDouble, gpu_dev: Path, tmp_path: Path
) -> None:
    """Proxmox creates a CT whose mpN source is missing, then refuses to start it (pve-container's
    mountpoint_mount, modelled by the double): the role checks the source on the host first."""
    missing = tmp_path / "no-such-volume" / "workspace"
    res = run_role(tmp_path / "run", base_vars(pve, gpu_dev, pve_ct_vmid=231, pve_ct_hostname="ct231",
                                               pve_ct_bind_mounts=[{"host_path": str(missing),
                                                                    "mount_point": "/workspace"}]))
    assert res.rc != 0
    assert any(f"bind mount source {missing}" in f and "does not exist" in f and "create: true" in f
               for f in res.failures), res.failures
    assert "231" not in pve.state()["cts"]


def test_create_true_makes_the_source_inside_an_existing_parent(
    pve: PveDouble, gpu_dev: Path, tmp_path: Path
) -> None:
    src = tmp_path / "volume" / "workspace"
    (tmp_path / "volume").mkdir()
    me = {"owner": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}
    mount = {"host_path": str(src), "mount_point": "/workspace", "create": True, "mode": "0750"}
    extra = dict(pve_ct_vmid=232, pve_ct_hostname="ct232", pve_ct_bind_mounts=[mount])
    first = run_role(tmp_path / "one", base_vars(pve, gpu_dev, **extra))
    assert first.rc == 0, first.failures
    # made for the unprivileged container's root: host uid and gid 100000
    assert src.is_dir() and oct(src.stat().st_mode & 0o777) == "0o750"
    assert (src.stat().st_uid, src.stat().st_gid) == (100000, 100000)
    assert pve.state()["cts"]["232"]["config"]["mp0"] == f"{src},mp=/workspace"
    again = run_role(tmp_path / "two", base_vars(pve, gpu_dev, **extra))
    assert again.rc == 0 and again.changed == 0, again.changed_tasks
    # A source whose parent is missing (an unmounted volume) is never made.
    orphan = {"host_path": str(tmp_path / "unmounted" / "workspace"), "mount_point": "/workspace",
              "create": True, **me}
    res = run_role(tmp_path / "three", base_vars(pve, gpu_dev, pve_ct_vmid=233, pve_ct_hostname="ct233",
                                                 pve_ct_bind_mounts=[orphan]))
    assert res.rc != 0
    assert any("mount the volume that holds it first" in f for f in res.failures), res.failures
    assert not (tmp_path / "unmounted").exists() and "233" not in pve.state()["cts"]


def test_the_double_refuses_to_start_a_ct_whose_bind_source_is_missing(tmp_path: Path) -> None:
    """The double's side of the rule, through the real proxmoxer: create succeeds, start fails with
    pve-container's message in the task log, and starts once the source exists."""
    from proxmoxer import ProxmoxAPI

    state = default_state("pve1")
    template = "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"
    state["storage"]["local"]["volumes"].append({"volid": template, "content": "vztmpl", "size": 1})
    double = PveDouble(tmp_path / "pve")
    double.state_path.parent.mkdir(parents=True, exist_ok=True)
    double.state_path.write_text(json.dumps(state))
    double.start()
    try:
        api = ProxmoxAPI("127.0.0.1", port=double.port, user="root@pam", password=double.root_password,
                         verify_ssl=str(double.ca))
        node = api.nodes("pve1")
        wait_task(node, node.lxc.post(vmid=234, ostemplate=template, rootfs="scratch:8",
                                  mp0=f"{tmp_path}/gone,mp=/workspace"))
        upid = node.lxc(234).status.start.post()
        assert wait_task(node, upid)["exitstatus"] == "startup for container '234' failed"
        log = [line["t"] for line in node.tasks(upid).log.get()]
        assert f"directory '{tmp_path}/gone' does not exist" in log
        (tmp_path / "gone").mkdir()
        assert wait_task(node, node.lxc(234).status.start.post())["exitstatus"] == "OK"
    finally:
        double.stop()


def test_a_container_the_product_did_not_create_is_refused(
    pve: PveDouble, gpu_dev: Path, tmp_path: Path
) -> None:
    """A VMID already taken by someone else's container (no `dflash` tag) is never rewritten or restarted;
    tagging it on purpose adopts it, and its other tags stay."""
    from proxmoxer import ProxmoxAPI

    api = ProxmoxAPI("127.0.0.1", port=pve.port, user="root@pam", password=pve.root_password,
                     verify_ssl=str(pve.ca))
    node = api.nodes("pve1")
    template = "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"
    wait_task(node, node.lxc.post(vmid=240, ostemplate=template, rootfs="scratch:8", hostname="db",
                              unprivileged=1, tags="prod, Database"))
    before = pve.state()["cts"]["240"]
    assert before["config"]["tags"] == "Database;prod"  # stored as PVE stores them: unique, sorted, ';'
    extra = dict(pve_ct_vmid=240, pve_ct_hostname="ct240")
    pve.clear_log()
    res = run_role(tmp_path / "one", base_vars(pve, gpu_dev, **extra))
    assert res.rc != 0
    assert any("CT 240 exists but does not carry the tag 'dflash'" in f and "pct set 240 --tags" in f
               for f in res.failures), res.failures
    assert writes(pve.requests()) == [] and pve.state()["cts"]["240"] == before

    node.lxc(240).config.put(tags="Database;prod;dflash")
    adopted = run_role(tmp_path / "two", base_vars(pve, gpu_dev, **extra))
    assert_ok(adopted)
    cfg = pve.state()["cts"]["240"]["config"]
    assert cfg["hostname"] == "ct240" and cfg["tags"] == "Database;dflash;prod"


def test_setting_tags_needs_vm_config_options(pve: PveDouble) -> None:
    """The double's side: PVE checks VM.Config.Options on the guest for an added or removed tag
    (GuestHelpers.pm assert_tag_permissions); a token without it cannot mark a container."""
    from pve_api import ApiError, normalize_tags

    def deny(path: str, privs: list[str]) -> None:
        raise ApiError(403, f"Permission check failed ({path}, {', '.join(privs)})")

    with pytest.raises(ApiError, match=r"/vms/250, VM.Config.Options"):
        normalize_tags("250", None, "dflash", deny)
    assert normalize_tags("250", "a;b", "b,a", deny) == "a;b"  # unchanged: no check
    with pytest.raises(ApiError, match="invalid tag"):
        normalize_tags("250", None, "-bad", lambda *_: None)


def test_unprivileged_ct_refuses_a_writable_source_it_could_not_write(
    pve: PveDouble, gpu_dev: Path, tmp_path: Path
) -> None:
    """An unprivileged container's root is host uid 100000, and a directory owned by host root is `nobody`'s
    to it: a writable bind mount of one is refused before anything is created, with the chown that fixes
    it; the same directory read-only is fine."""
    src = tmp_path / "root-owned"
    src.mkdir()
    os.chown(src, 0, 0)
    mount = {"host_path": str(src), "mount_point": "/workspace"}
    extra = dict(pve_ct_vmid=234, pve_ct_hostname="ct234", pve_ct_bind_mounts=[mount])
    res = run_role(tmp_path / "one", base_vars(pve, gpu_dev, **extra))
    assert res.rc != 0
    fail = " ".join(res.failures)
    assert f"bind mount source {src} is owned by host uid 0" in fail, res.failures
    assert f"`chown -R 100000:100000 {src}`" in fail and "read_only: true" in fail
    assert "234" not in pve.state()["cts"]
    ro = dict(extra, pve_ct_bind_mounts=[dict(mount, read_only=True)])
    ok = run_role(tmp_path / "two", base_vars(pve, gpu_dev, **ro))
    assert_ok(ok)
    assert pve.state()["cts"]["234"]["config"]["mp0"] == f"{src},mp=/workspace,ro=1"


def test_privileged_opt_in_says_what_it_gives_away(pve: PveDouble, gpu_dev: Path, tmp_path: Path) -> None:
    """pve_ct_unprivileged: false makes a privileged CT, and the play prints what that gives away."""
    src = tmp_path / "host-owned"
    src.mkdir()
    os.chown(src, 0, 0)  # a privileged CT writes it as the host's root
    extra = dict(pve_ct_vmid=235, pve_ct_hostname="ct235", pve_ct_unprivileged=False,
                 pve_ct_bind_mounts=[{"host_path": str(src), "mount_point": "/workspace"}])
    res = run_role(tmp_path / "one", base_vars(pve, gpu_dev, **extra))
    assert_ok(res)
    assert pve.state()["cts"]["235"]["config"]["unprivileged"] == 0
    assert "CT 235 is PRIVILEGED" in res.output and "root in the container is root on the host" in res.output
    assert f"bind mounts ['{src}'] are written as the host's root" in res.output
