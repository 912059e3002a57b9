"""Role sglang against the production inventory's shape (inventory/example), before any connection.

The B200 node of inventory/example binds 0.0.0.0 with the vault's API key and serves an hf:// model;
the role refuses to go on without a pinned revision (a commit sha), and without an API key beyond
loopback, before it connects to the node. molecule/sglang runs the role itself (uv from PyPI, SGLang
stand-in wheels, stand-in nvidia-smi, Fabric Manager/NVLSM units, /dev/shm staging).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


KEYRING = ("-e", "sglang_cuda_keyring_checksum=sha256:" + "0" * 64)  # the example's is a placeholder to fill


def _sglang_play(*args: str, keyring: bool = True) -> str:
    env = dict(
        os.environ,
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
    )
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    r = subprocess.run(
        [exe, "playbooks/sglang.yml", "-i", "inventory/example", *(KEYRING if keyring else ()), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    return " ".join((r.stdout + r.stderr).split())


def test_example_b200_node_needs_the_api_key_and_a_pinned_revision() -> None:
    out = _sglang_play(keyring=False)
    placeholder = "sha256:REPLACE-with-the-sha256-of-cuda-keyring_1.1-1_all.deb"
    assert f"sglang_cuda_keyring_checksum={placeholder} (empty or sha256:HEX)" in out, out[-2000:]
    out = _sglang_play()
    assert "sglang_host=0.0.0.0 / sglang_router_host=0.0.0.0 is not loopback; set sglang_api_key" in out, out[
        -2000:
    ]
    assert "UNREACHABLE" not in out
    out = _sglang_play("-e", "vault_sglang_api_key=k")
    assert "hf://Qwen/Qwen3.6-27B needs sglang_model_revision set to the commit sha" in out, out[-2000:]
    assert "UNREACHABLE" not in out
    out = _sglang_play("-e", "vault_sglang_api_key=k", "-e", "sglang_model_revision=main")
    assert "(got 'main')" in out, "a branch name is not a pinned revision"
    # With both, the role goes on to the node (unreachable here: 10.0.1.20 is the example's): its first task
    # there reads the node's addresses, which this play (playbooks/sglang.yml, no facts) did not gather.
    out = _sglang_play("-e", "vault_sglang_api_key=k", "-e", "sglang_model_revision=" + "0" * 40)
    assert "Read this node's addresses when the play has not gathered them" in out, out[-2000:]
    assert "UNREACHABLE" in out, out[-2000:]


def test_the_install_requires_a_lock_that_pins_the_role_versions() -> None:
    """SGLang comes only from a lock with hashes: no lock, or one of other versions, stops the play."""
    ok = ("-e", "vault_sglang_api_key=k", "-e", "sglang_model_revision=" + "0" * 40)
    out = _sglang_play(*ok, "-e", "sglang_requirements_lock=")
    assert "sglang: sglang_requirements_lock='' is not a file on the controller" in out, out[-2000:]
    out = _sglang_play(*ok, "-e", "sglang_version=0.0.1")
    assert "does not pin sglang==0.0.1 (sglang_version)" in out, out[-2000:]
    assert "UNREACHABLE" not in out
