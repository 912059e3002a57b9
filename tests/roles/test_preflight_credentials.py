"""Role preflight's Proxmox API check (entry point `pve_api`, run by `main` on a Proxmox host that holds GPU
containers, before the kernel build) and its placeholder shapes.

The check runs with the real `ansible-playbook` and the real ansible.builtin.uri against the Proxmox API
double (tests/doubles/pve_api.py: its API-token header check and /access/ticket answer HTTP 401 as Proxmox
does), because a real Proxmox VE cannot run here. Every run's whole output (the JSON callback prints every
task's result) is searched for the secrets: none may appear.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pve_run import REPO, PveDouble, run_role

ZERO_UUID = "00000000-0000-0000-0000-000000000000"
WRONG_TOKEN = "7d1e5a2c-0f4b-4c3e-8a69-3b2d1f0e9c84"


def _filter() -> Any:
    spec = importlib.util.spec_from_file_location(
        "placeholders", REPO / "roles/preflight/filter_plugins/placeholders.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.preflight_placeholders


def api_vars(pve: PveDouble, **extra: Any) -> dict[str, Any]:
    """The preflight_pve_api_* settings that point the check at the double, right by default."""
    return {
        "preflight_pve_api_host": "127.0.0.1",
        "preflight_pve_api_port": pve.port,
        "preflight_pve_api_user": "root@pam",
        "preflight_pve_api_token_id": "ansible",
        "preflight_pve_api_token_secret": pve.token.rpartition("=")[2],
        "preflight_pve_api_ca_path": str(pve.ca),
        **extra,
    }


def check(
    pve: PveDouble, workdir: Path, secrets: list[str], *, check_mode: bool = False, **extra: Any
) -> Any:
    """Run entry point pve_api once; no secret (those given, the right ones) may be in its output."""
    pve.clear_log()
    res = run_role(workdir, api_vars(pve, **extra), role="preflight", tasks_from="pve_api", check=check_mode)
    for secret in [*secrets, pve.token.rpartition("=")[2]]:
        assert secret not in res.output, f"a secret is in the output: {secret!r}"
    return res


def calls(pve: PveDouble) -> list[tuple[str, str, int]]:
    return [(r["method"], r["path"], r["status"]) for r in pve.requests()]


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check-mode"])
def test_the_right_token_passes_and_no_password_is_tried(
    pve: PveDouble, tmp_path: Path, check_mode: bool
) -> None:
    res = check(pve, tmp_path, [], check_mode=check_mode)
    assert res.rc == 0, res.failures
    assert calls(pve) == [("GET", "/api2/json/version", 200)]
    assert res.changed == 0, res.changed_tasks


def test_a_wrong_token_is_refused_naming_the_token_variables(pve: PveDouble, tmp_path: Path) -> None:
    res = check(pve, tmp_path, [WRONG_TOKEN], preflight_pve_api_token_secret=WRONG_TOKEN)
    assert res.rc != 0
    fail = " ".join(res.failures)
    assert "rejected API token 'root@pam!ansible' (HTTP 401)" in fail, res.failures
    assert "pve_api_token_secret" in fail and "pve_api_token_id" in fail and "pve_api_user" in fail
    assert f"https://127.0.0.1:{pve.port}/api2/json" in fail
    assert calls(pve) == [("GET", "/api2/json/version", 401)]  # stopped there: no password was tried


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("preflight_pve_api_token_secret", ZERO_UUID, "pve_api_token_secret"),
        ("preflight_pve_api_token_secret", "...", "pve_api_token_secret"),
        ("preflight_pve_api_token_secret", "", "pve_api_token_secret"),
        ("preflight_pve_api_token_id", "REPLACE-with-token-id", "pve_api_token_id"),
    ],
)
def test_a_placeholder_is_refused_before_any_request(
    pve: PveDouble, tmp_path: Path, var: str, value: str, named: str
) -> None:
    res = check(pve, tmp_path, [], **{var: value})
    assert res.rc != 0
    fail = " ".join(res.failures)
    assert "are not filled in" in fail and named in fail, res.failures
    assert calls(pve) == []  # nothing was sent


@pytest.mark.parametrize(
    ("var", "value"),
    [("preflight_pve_api_token_id", "root@pam!ansible"), ("preflight_pve_api_user", "root")],
)
def test_a_malformed_user_or_token_id_is_refused_before_any_request(
    pve: PveDouble, tmp_path: Path, var: str, value: str
) -> None:
    """The full token id in the token id, or a user without its realm (Proxmox's USER@REALM!TOKENID)."""
    res = check(pve, tmp_path, [], **{var: value})
    assert res.rc != 0
    fail = " ".join(res.failures)
    assert "must read USER@REALM" in fail and var.replace("preflight_", "") in fail, res.failures
    assert calls(pve) == []


def test_an_unreachable_api_names_the_url_and_why_it_is_needed(pve: PveDouble, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = check(pve, tmp_path, [], preflight_pve_api_port=port, preflight_pve_api_timeout=5)
    assert res.rc != 0
    fail = " ".join(res.failures)
    assert f"cannot reach the Proxmox API at https://127.0.0.1:{port}/api2/json" in fail, res.failures
    assert "this check needs it before the kernel build" in fail


def test_a_certificate_from_another_ca_is_refused(pve: PveDouble, tmp_path: Path) -> None:
    """TLS is verified: a CA that did not sign the API's certificate is refused, naming the CA setting."""
    make_ca = sys.modules[PveDouble.__module__].make_ca  # tests/doubles/pve_api_fixture.py
    other_ca, _cert, _key = make_ca(tmp_path / "other-ca")
    res = check(pve, tmp_path / "run", [], preflight_pve_api_ca_path=str(other_ca))
    assert res.rc != 0, "a certificate that does not verify was accepted"
    fail = " ".join(res.failures)
    assert "does not verify against" in fail and "pve_api_ca_path" in fail, res.failures
    assert calls(pve) == []  # the handshake failed: no request reached the API


def test_the_cluster_ca_is_read_from_the_host_without_a_ca_path(pve: PveDouble, tmp_path: Path) -> None:
    """pve_api_ca_path "" (the example's): the CA comes from the Proxmox host's preflight_pve_api_ca_src
    and is kept on the controller; a second run changes nothing."""
    cache = tmp_path / "cache" / "pve1-pve-root-ca.pem"
    extra = dict(
        preflight_pve_api_ca_path="",
        preflight_pve_api_ca_src=str(pve.ca),
        preflight_pve_api_ca_cache=str(cache),
    )
    first = check(pve, tmp_path / "one", [], **extra)
    assert first.rc == 0, first.failures
    assert cache.read_text() == pve.ca.read_text()
    second = check(pve, tmp_path / "two", [], **extra)
    assert second.rc == 0 and second.changed == 0, second.changed_tasks


def test_the_vault_example_values_are_placeholders() -> None:
    """Every value of inventory/example/vault.example.yml is refused, by name; a secret's value is never
    shown; real-looking values are not refused."""
    find = _filter()
    example = yaml.safe_load((REPO / "inventory/example/vault.example.yml").read_text())
    left = find(example)
    assert sorted(x.split(":", 1)[0] for x in left) == sorted(example), left
    assert all("not shown" in x for x in left), left
    real = {
        "vault_pve_api_token_secret": "0b6a1f4e-2c1d-4d8e-9a57-5f3c8e2d7b10",
        "vault_hf_token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
        "comment": "Loading...",
        "nvidia_open_version": "595.71.05",
        "kernel_localversion": "-gpunode",
    }
    assert find(real) == []
    assert find({"digest": "0" * 64, "sha": "REPLACE-me"}) == ["digest: " + "0" * 64, "sha: REPLACE-me"]


def _inventory(tmp_path: Path, pve: PveDouble, **host_vars: Any) -> Path:
    """A Proxmox host (this machine, as localhost) holding CT 200, with the double as its API."""
    inv = {
        "all": {
            "children": {
                "proxmox_hosts": {
                    "hosts": {
                        "pve1": {
                            "ansible_connection": "local",
                            "ansible_host": "127.0.0.1",
                            "ansible_python_interpreter": sys.executable,
                            "ansible_become": False,
                            "host_build": False,
                            "preflight_facts_dir": str(tmp_path / "facts.d"),
                            "pve_api_host": "127.0.0.1",
                            "pve_api_ca_path": str(pve.ca),
                            "pve_api_token_secret": pve.token.rpartition("=")[2],
                            **host_vars,
                        }
                    }
                },
                "gpu_containers": {"hosts": {"ct200": {"pve_ct_host": "pve1"}}},
            }
        }
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _preflight(inventory: Path, port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "false"}
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "playbooks/preflight.yml"]
    cmd += ["-i", str(inventory), "-e", f"preflight_pve_api_port={port}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_site_runs_the_preflight_play_before_the_kernel_build() -> None:
    plays = [p["ansible.builtin.import_playbook"] for p in yaml.safe_load((REPO / "site.yml").read_text())]
    assert plays.index("playbooks/preflight.yml") < plays.index("playbooks/host.yml"), plays


def test_the_preflight_play_checks_the_api_on_a_proxmox_host(pve: PveDouble, tmp_path: Path) -> None:
    """playbooks/preflight.yml (site.yml's second play) runs the check on a Proxmox host that holds a
    container: a wrong token stops it there, naming the variable; the right one passes."""
    pve.clear_log()
    bad = _preflight(_inventory(tmp_path / "bad", pve, pve_api_token_secret=WRONG_TOKEN), pve.port)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0
    assert "rejected API token 'root@pam!ansible' (HTTP 401)" in out, out[-3000:]
    assert "pve_api_token_secret" in out
    assert WRONG_TOKEN not in out
    assert calls(pve) == [("GET", "/api2/json/version", 401)]
    assert not (tmp_path / "bad" / "facts.d").exists()  # stopped before the role wrote anything
    pve.clear_log()
    good = _preflight(_inventory(tmp_path / "good", pve), pve.port)
    out = good.stdout + good.stderr
    assert good.returncode == 0, out[-3000:]
    assert "Check the Proxmox API credentials that role pve_ct will use" in out, out[-3000:]
    assert calls(pve) == [("GET", "/api2/json/version", 200)]
    assert pve.token.rpartition("=")[2] not in out


def test_the_example_with_the_vault_example_stops_in_the_first_play(tmp_path: Path) -> None:
    """The example inventory with vault.example.yml copied as its vault, unfilled: site.yml's first play
    names each vault variable, before any host or API is contacted."""
    inv = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory/example", inv)
    (inv / "group_vars/all/vault.yml").write_text((REPO / "inventory/example/vault.example.yml").read_text())
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1"}
    res = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "playbooks/inputs.yml", "-i", str(inv)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0
    for name in yaml.safe_load((REPO / "inventory/example/vault.example.yml").read_text()):
        assert f"{name}: (a placeholder" in out, (name, out[-3000:])
    assert "pve_api_token_secret: (a placeholder" in out and "pve_api_root_password" not in out
    assert "UNREACHABLE" not in out
