"""molecule/images/build.sh never reads or deletes across a mount point: `release_mounts` unmounts
what debootstrap left mounted in a rootfs (proc, a busy mount lazily) or fails naming it. Real mounts
(a tmpfs and a bind of the host's /proc, as debootstrap leaves it), so this needs root."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

MOUNTS = Path(__file__).resolve().parents[2] / "molecule/images/mounts.sh"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs and /proc needs root")


def _mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_release_mounts_unmounts_proc_and_nested_mounts_in_a_rootfs(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "proc").mkdir(parents=True)
    (root / "run" / "lock").mkdir(parents=True)
    subprocess.run(["mount", "--bind", "/proc", str(root / "proc")], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root / "run")], check=True)
    (root / "run" / "lock").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root / "run" / "lock")], check=True)
    busy = subprocess.Popen(["sleep", "30"], cwd=root / "run" / "lock")  # keeps that mount busy
    try:
        assert _mounted(root / "proc")
        r = subprocess.run(["bash", "-c", f'source "{MOUNTS}" && release_mounts "{root}"'],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert not any(_mounted(p) for p in (root / "proc", root / "run", root / "run" / "lock"))
        # what build.sh then does with the rootfs stays inside it
        out = subprocess.run(["tar", "-C", str(root), "--one-file-system", "-c", "."], capture_output=True,
                             timeout=60)
        assert out.returncode == 0 and len(out.stdout) < 1 << 20
    finally:
        busy.kill()
        busy.wait()
        for p in (root / "run" / "lock", root / "run", root / "proc"):
            subprocess.run(["umount", "-l", str(p)], capture_output=True)


def test_release_mounts_of_a_clean_or_missing_dir_is_a_no_op(tmp_path: Path) -> None:
    for d in (tmp_path, tmp_path / "absent"):
        r = subprocess.run(["bash", "-c", f'source "{MOUNTS}" && release_mounts "{d}"'], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
