#!/usr/bin/env python3
"""The real-boot lane: role kernel's safe boot against virtual machines with real firmware, GRUB, kernels,
reboots and a watchdog device. `bin/test boot` runs it; it builds the disks first (tests/boot/build.sh).

    python tests/boot/run.py                 # every scenario
    python tests/boot/run.py uefi-lvm-panic  # some
    python tests/boot/run.py --list

Each scenario prints one line: what it expected, the kernel each boot ran (from the VM's serial console),
and whether it passed. A scenario's files (console log, Ansible's output, the VM's disk overlay) stay in
.cache/boot/runs/NAME until the next run of that scenario.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from vm import VM  # noqa: E402  (run as a script: tests/boot is not a package)

CACHE = Path(os.environ.get("BOOT_CACHE", REPO / ".cache" / "boot"))


@dataclass(frozen=True)
class Scenario:
    name: str
    layout: str
    what: str
    brk: str  # how the new kernel is broken: none | panic | unreachable (tests/boot/scenario.yml)
    expect_default_new: bool  # the play makes the new kernel the default (else it fails, back on the old)
    rerun_unchanged: bool = False  # a second run of the play reports changed=0
    extra: dict[str, object] = field(default_factory=dict)  # more variables for the play
    expect_active: tuple[str, ...] = ()  # units that must be active on the kernel the VM runs at the end
    expect_boot_note: str = ""  # a mark the console must show on a boot of the new kernel, e.g. "(dead-man)"


# The lane's VMs boot slowly under TCG: the dead-man waits 4 minutes, the controller 15.
LANE_VARS: dict[str, object] = {"kernel_boot_confirm_s": 240, "kernel_reboot_timeout_s": 900}


SCENARIOS = [
    Scenario("uefi-lvm-good", "uefi-lvm",
             "UEFI + LVM, a good new kernel: booted once, checked, pinned; a rerun changes nothing",
             "none", True, rerun_unchanged=True),
    Scenario("uefi-lvm-panic", "uefi-lvm",
             "UEFI + LVM, the new kernel panics: the one-shot on the ESP was consumed, the old kernel "
             "boots, the play fails saying so", "panic", False),
    Scenario("uefi-lvm-unreachable", "uefi-lvm",
             "UEFI + LVM, the new kernel boots without network: its dead-man reboots it, the old kernel "
             "boots, the play fails saying so", "unreachable", False,
             expect_boot_note="(dead-man)"),
    Scenario("uefi-lvm-watchdog-mux", "uefi-lvm",
             "UEFI + LVM with Proxmox VE's watchdog-mux and kernel_boot_watchdog=i6300esb: the good kernel "
             "is pinned and watchdog-mux still holds the watchdog",
             "none", True, extra={"boot_lane_watchdog_mux": True, "kernel_boot_watchdog": "i6300esb"},
             expect_active=("watchdog-mux.service",)),
    Scenario("bios-lvm-panic", "bios-lvm",
             "BIOS + LVM, the ESP formatted but not in fstab (as the installer leaves it): the role "
             "mounts it for the one-shot, the new kernel panics, GRUB (i386-pc) had cleared it: the old "
             "kernel boots",
             "panic", False),
]


def panic_initrd() -> Path:
    """An initramfs whose /init exits at once: the kernel panics ("Attempted to kill init!")."""
    out = CACHE / "panic-initrd.img"
    if out.exists():
        return out
    busybox = shutil.which("busybox")
    if not busybox:
        raise SystemExit("busybox not found (Debian's busybox-static; bin/bootstrap installs it)")
    root = CACHE / "panic-initrd"
    shutil.rmtree(root, ignore_errors=True)
    (root / "bin").mkdir(parents=True)
    shutil.copy(busybox, root / "bin" / "busybox")
    (root / "init").write_text(
        "#!/bin/busybox sh\n/bin/busybox echo 'boot lane: this initramfs exits'\nexit 1\n")
    (root / "init").chmod(0o755)
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, check=True).stdout
    cpio = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files, capture_output=True,
                          check=True).stdout
    out.write_bytes(subprocess.run(["gzip", "-9"], input=cpio, capture_output=True, check=True).stdout)
    return out


def play(vm: VM, workdir: Path, extra: dict[str, object], log_name: str) -> tuple[int, str]:
    inventory = workdir / "inventory.yml"
    inventory.write_text(
        "boot_vms:\n  hosts:\n    pve-vm:\n"
        f"      ansible_host: 127.0.0.1\n      ansible_port: {vm.port}\n      ansible_user: root\n"
        f"      ansible_ssh_private_key_file: {vm.key}\n"
        "      ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null\n"
        "      ansible_python_interpreter: /usr/bin/python3\n"
    )
    (workdir / "vars.json").write_text(json.dumps(extra))
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), "-e",
            f"@{workdir / 'vars.json'}", str(HERE / "scenario.yml")]
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_HOST_KEY_CHECKING": "False"}
    with (workdir / log_name).open("w") as log:  # streamed: `tail -f` follows a scenario
        r = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    return r.returncode, (workdir / log_name).read_text()


def releases() -> tuple[str, str]:
    return (CACHE / "old-release").read_text().strip(), (CACHE / "new-release").read_text().strip()


def play_vars(brk: str = "none") -> dict[str, object]:
    _, new = releases()
    return {"boot_lane_new_debs": sorted(str(p) for p in (CACHE / "debs").glob("linux-image-*.deb")),
            "boot_lane_new_release": new, "boot_lane_break": brk,
            "boot_lane_panic_initrd": str(panic_initrd()), **LANE_VARS}


def installed(layout: str) -> Path:
    """The layout's disk after role kernel's install step put the new kernel beside the old one (the old one
    pinned first): made once, the scenarios start from overlays of it."""
    disk = CACHE / f"{layout}-installed.qcow2"
    if disk.exists():
        return disk
    t0 = time.monotonic()
    old, new = releases()
    workdir = CACHE / "runs" / f"install-{layout}"
    shutil.rmtree(workdir, ignore_errors=True)
    vm = VM(layout, workdir, CACHE)
    problems: list[str] = []
    try:
        vm.start()
        first = vm.wait_ssh(600)
        rc, out = play(vm, workdir, {**play_vars(), "boot_lane_stage": "install"}, "play.log")
        if rc != 0:
            problems.append(f"role kernel's install step failed (rc {rc}): {tail(out)}")
        check = vm.ssh(f"test -e /boot/vmlinuz-{new} && grub-editenv list").stdout
        if first != old or "saved_entry=" not in check or new in check.split("saved_entry=")[1].split()[0]:
            problems.append(f"after the install the VM runs {first} with GRUB's saved entry "
                            f"{check.strip() or '(none)'}: the old kernel {old} is not pinned")
        vm.poweroff()
    except (SystemExit, OSError, subprocess.SubprocessError) as e:
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        vm.stop()
    print(f"{'FAIL' if problems else 'PASS'} install-{layout} ({time.monotonic() - t0:.0f} s): role kernel's "
          f"install step puts {new} beside {old} and keeps {old} the default", flush=True)
    if problems:
        for p in problems:
            print(f"    {p}", flush=True)
        raise SystemExit(f"the install stage failed: {workdir}")
    (workdir / "disk.qcow2").rename(disk)
    return disk


def run(s: Scenario) -> bool:
    t0 = time.monotonic()
    workdir = CACHE / "runs" / s.name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    old, new = releases()
    vm = VM(s.layout, workdir, CACHE, base=installed(s.layout))
    problems: list[str] = []
    try:
        vm.start()
        first = vm.wait_ssh(600)
        if first != old:
            problems.append(f"the VM came up on {first}, not the old kernel {old}")
        extra: dict[str, object] = {**play_vars(s.brk), "boot_lane_install": False, **s.extra}
        rc, out = play(vm, workdir, extra, "play.log")
        final = vm.wait_ssh(600)
        if s.expect_default_new:
            if rc != 0:
                problems.append(f"the play failed (rc {rc}): {tail(out)}")
            if final != new:
                problems.append(f"the VM runs {final}, not the new kernel {new}")
        else:
            if rc == 0:
                problems.append("the play passed, but the new kernel should have been refused")
            elif f"{new} was NOT made the default" not in out:
                problems.append(
                    f"the play failed without saying the new kernel was not made the default: {tail(out)}")
            if final != old:
                problems.append(f"the VM runs {final}, not the old kernel {old}")
        for unit in s.expect_active:
            state = vm.ssh(f"systemctl is-active {unit}").stdout.strip()
            if state != "active":
                journal = vm.ssh(f"journalctl -b -o cat -n 5 -u {unit}").stdout.strip().replace("\n", " | ")
                problems.append(f"{unit} is {state} on {final}: {journal}")
        if s.expect_boot_note and not any(b.startswith(new) and s.expect_boot_note in b for b in vm.boots()):
            problems.append(f"no boot of {new} ended {s.expect_boot_note} on the console")
        if s.rerun_unchanged and not problems:
            rc2, out2 = play(vm, workdir, {**extra, "boot_lane_break": "none"}, "rerun.log")
            recap = [line for line in out2.splitlines() if line.startswith("pve-vm ")]
            if rc2 != 0 or not recap or "changed=0" not in recap[-1]:
                problems.append(f"the rerun was not changed=0 (rc {rc2}): {recap[-1:] or tail(out2)}")
    except (SystemExit, OSError, subprocess.SubprocessError) as e:
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        vm.stop()
    boots = " -> ".join(vm.boots()) or "(no boot seen on the console)"
    verdict = "FAIL" if problems else "PASS"
    print(f"{verdict} {s.name} ({time.monotonic() - t0:.0f} s): {s.what}\n    boots: {boots}", flush=True)
    for p in problems:
        print(f"    {p}", flush=True)
    if problems:
        print(f"    files: {workdir}", flush=True)
    return not problems


def tail(text: str, n: int = 6) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    by_name = {s.name: s for s in SCENARIOS}
    if a.list:
        for s in SCENARIOS:
            print(f"{s.name}: {s.what}")
        return 0
    unknown = [n for n in a.scenarios if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    chosen = [by_name[n] for n in a.scenarios] or SCENARIOS
    layouts = sorted({s.layout for s in chosen})
    subprocess.run([str(HERE / "build.sh"), *layouts], check=True)
    results = [run(s) for s in chosen]
    print(f"boot lane: {sum(results)} of {len(results)} scenarios passed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
