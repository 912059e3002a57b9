"""One virtual machine of the real-boot lane: QEMU (TCG: nested KVM is not usable on the machines this runs
on) booting a disk that tests/boot/build.sh laid out, with real firmware (OVMF for UEFI, SeaBIOS for BIOS),
real GRUB, real kernels, systemd, and QEMU's i6300esb watchdog wired to reset the machine as a board's does.

The disk is a qcow2 overlay of the layout's raw base, so each scenario starts from the installed system and
leaves the base clean. SSH reaches the guest on a port of 127.0.0.1 (QEMU's user network), as Ansible reaches
a host. The serial console is appended to `console.log` across reboots: every boot's "Linux version" line
and every panic is read from it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=5", "-o", "BatchMode=yes"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VM:
    """A scenario's VM: `start()`, `ssh(cmd)`, `wait_ssh()`, `boots()`, `stop()`."""

    layout: str  # uefi-lvm | bios-lvm
    workdir: Path
    cache: Path
    base: Path | None = None  # the disk the overlay starts from; default: the layout's raw disk
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def console(self) -> Path:
        return self.workdir / "console.log"

    @property
    def key(self) -> Path:
        return self.cache / "id_ed25519"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        disk = self.workdir / "disk.qcow2"
        if not disk.exists():
            base = self.base or self.cache / f"{self.layout}.raw"
            if not base.exists():
                raise SystemExit(f"{base} is missing: run tests/boot/build.sh {self.layout}")
            fmt = "qcow2" if base.suffix == ".qcow2" else "raw"
            overlay = ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", fmt, str(disk)]
            subprocess.run(overlay, check=True)
        argv = ["qemu-system-x86_64", "-accel", "tcg", "-machine", "q35", "-m", "1536", "-smp", "2",
                "-display", "none", "-no-user-config", "-nodefaults",
                "-chardev", f"file,id=ser0,path={self.console},append=on", "-serial", "chardev:ser0",
                # cache=unsafe: no host fsync for a throwaway disk
                "-drive", f"file={disk},format=qcow2,if=virtio,cache=unsafe",
                "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
                "-device", "virtio-net-pci,netdev=n0",
                # The board's watchdog: when nothing pets it, QEMU resets the machine (as iTCO/sp5100 do).
                "-device", "i6300esb", "-action", "watchdog=reset",
                "-monitor", f"unix:{self.workdir / 'monitor.sock'},server,nowait"]
        if self.layout.startswith("uefi"):
            vars_fd = self.workdir / "OVMF_VARS.fd"
            if not vars_fd.exists():
                shutil.copyfile(OVMF_VARS, vars_fd)
            argv += ["-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
                     "-drive", f"if=pflash,format=raw,unit=1,file={vars_fd}"]
        with (self.workdir / "qemu.log").open("ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)

    def ssh_argv(self, command: str) -> list[str]:
        return ["ssh", *SSH_OPTS, "-i", str(self.key), "-p", str(self.port), "root@127.0.0.1", command]

    def ssh(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.ssh_argv(command), capture_output=True, text=True, timeout=timeout, check=False)

    def wait_ssh(self, timeout: float) -> str:
        """The release the guest runs, once SSH answers; SystemExit after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SystemExit(f"QEMU exited ({self.proc.returncode}): see {self.workdir / 'qemu.log'}")
            try:
                r = self.ssh("uname -r", timeout=20)
            except subprocess.TimeoutExpired:
                continue
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout.strip()
            time.sleep(2)
        raise SystemExit(f"the VM did not answer on SSH within {timeout:g} s (console: {self.console})")

    def boots(self) -> list[str]:
        """Each boot's kernel release in order, from the console ("Linux version X"), a panic marked."""
        text = self.console.read_text(errors="replace") if self.console.exists() else ""
        out: list[str] = []
        for line in text.splitlines():
            m = re.search(r"Linux version (\S+)", line)
            if m:
                out.append(m.group(1))
            elif "Kernel panic - not syncing" in line and out and not out[-1].endswith(" (panic)"):
                out[-1] += " (panic)"
            elif "gpu-node-boot-deadman:" in line and out and not out[-1].endswith(" (dead-man)"):
                out[-1] += " (dead-man)"
        return out

    def poweroff(self, timeout: float = 300) -> None:
        """Shut the guest down cleanly and wait for QEMU to exit (its disk is then consistent)."""
        self.ssh("systemctl poweroff", timeout=30)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise SystemExit(f"the VM did not power off within {timeout:g} s") from None
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
