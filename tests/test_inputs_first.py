"""site.yml checks every inventory value before it touches any host (playbooks/inputs.yml).

These run the real ansible-playbook on the real example inventory (and copies of it with values filled in
or broken): the first play's asserts need no connection, so no host, container or Proxmox is involved and
none is contacted. A value left wrong must stop the run there, naming its variable, instead of after the
Proxmox host's kernel build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = [str(Path(sys.executable).parent / "ansible-playbook")]
HEX = "0123456789abcdef" * 4


def _play(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([*PLAYBOOK, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _filled(tmp_path: Path, vault: bool = True) -> Path:
    """A copy of inventory/example with every placeholder replaced by a value of the right form."""
    inv = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory/example", inv)
    for f in inv.rglob("*.yml"):
        text = f.read_text()
        text = re.sub(r'"sha256:REPLACE[^"]*"', f'"sha256:{HEX}"', text)
        text = re.sub(r'"REPLACE-with-sha256sum[^"]*"', f'"{HEX}"', text)
        text = re.sub(r'"REPLACE-with-the-40-hex[^"]*"', f'"{HEX[:40]}"', text)
        text = text.replace("AAAA...REPLACE-with-the-controller's-public-key",
                            "AAAAC3NzaC1lZDI1NTE5AAAAIDx0dW1teWtleWZvcnRlc3RzMDAwMDAwMDAwMDAw")
        f.write_text(text)
    if vault:  # what the encrypted vault file holds once filled in, in the clear for the test
        vault_file = inv / "group_vars/all/vault.yml"
        example = (ROOT / "inventory/example/vault.example.yml").read_text()
        vault_file.write_text(re.sub(r'^(vault_\w+): ".*"$', r'\1: "filled-\1"', example, flags=re.M))
    return inv


def test_the_example_as_shipped_stops_in_the_first_play_naming_the_placeholders() -> None:
    res = _play("site.yml", "-i", "inventory/example", "--check")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "nvidia_open_run_sha256: REPLACE" in out, out[-3000:]
    assert "nvidia_open_source_sha256: REPLACE" in out, out[-3000:]
    assert "gpu_userspace_cuda_keyring_checksum" in out and "pve_ct_ssh_public_keys[0]" in out, out[-3000:]
    assert "target_model_revision: REPLACE" in out, out[-3000:]
    # The run stopped there: no later play started and no host was contacted.
    assert "PLAY [Preflight every node" not in out and "UNREACHABLE" not in out, out[-3000:]
    assert "PLAY [Check every inventory value before any host is touched]" in out


def test_a_filled_example_passes_and_the_real_order_goes_on(tmp_path: Path) -> None:
    inv = _filled(tmp_path)
    res = _play("playbooks/inputs.yml", "-i", str(inv))
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert re.search(r"pve1\s+: ok=\d+ .*failed=0", res.stdout), res.stdout[-2000:]
    assert re.search(r"b200-1\s+: ok=\d+ .*failed=0", res.stdout), res.stdout[-2000:]


def test_a_missing_secret_is_named(tmp_path: Path) -> None:
    inv = _filled(tmp_path, vault=False)  # no vault file: the secrets read as ""
    res = _play("playbooks/inputs.yml", "-i", str(inv))
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "pve_ct_api_token_secret must be set" in out, out[-3000:]


@pytest.mark.parametrize(("var", "bad", "named"), [
    ("nvidia_open_run_sha256", "ABCDEF" + HEX[6:], "nvidia_open_run_sha256 = 64 lowercase hex digits"),
    ("nvidia_open_source_sha256", HEX[:63], "a 64-hex nvidia_open_source_sha256"),
    ("node_driver_version", "latest", "nvidia_open_version (node_driver_version) must read like MAJOR"),
    ("gpu_userspace_cuda_keyring_checksum", HEX, "gpu_userspace_cuda_keyring_checksum (sha256:HEX)"),
    ("sglang_model_revision", "main", "needs sglang_model_revision set to the commit sha"),
])
def test_a_malformed_value_is_named(tmp_path: Path, var: str, bad: str, named: str) -> None:
    inv = _filled(tmp_path)
    res = _play("playbooks/inputs.yml", "-i", str(inv), "-e", f"{var}={bad}")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert named in out, out[-3000:]
