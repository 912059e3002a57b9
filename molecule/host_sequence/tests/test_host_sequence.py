"""playbooks/host.yml end to end: build, modules for the NEW kernel before the reboot, one boot, default.

The boot chain is simulated (tests/doubles/fake-boot/fakeboot.py, real tools' semantics); the kernel
build and the out-of-tree module build against the new kernel's headers are real.
"""

import json

import pytest

# The stand-in's grub.cfg, as grub-mkconfig writes it on a PVE host with a plain /boot (ids carry the
# filesystem UUID); the role resolves entries from it.
UUID = "6f1d2a4e-0c0b-4d0e-9a55-3b1f2c7d8e90"
ENTRY = f"gnulinux-advanced-{UUID}>gnulinux-{{}}-advanced-{UUID}"


@pytest.fixture(scope="module")
def fact(host):
    """Each role's own local fact: kernel.fact and nvidia_open.fact."""
    return {
        role: json.loads(host.file(f"/etc/ansible/facts.d/{role}.fact").content_string)
        for role in ("kernel", "nvidia_open")
    }


@pytest.fixture(scope="module")
def release(fact):
    rel = fact["kernel"]["release"]
    assert rel.endswith("-hostseq"), rel
    return rel


def test_modules_were_built_for_the_new_kernel_not_the_running_one(host, fact, release):
    old = host.file("/var/lib/fake-boot/initial").content_string.strip()
    assert fact["nvidia_open"]["kernel"] == release != old
    for m in ("nvidia", "nvidia-uvm"):
        ko = host.file(f"/lib/modules/{release}/updates/nvidia-open/{m}.ko")
        assert ko.exists, m
        vermagic = host.check_output(f"modinfo -F vermagic {ko.path}")
        assert vermagic.split()[0] == release, vermagic


def test_one_boot_then_default(host, release):
    old = host.file("/var/lib/fake-boot/initial").content_string.strip()
    calls = host.file("/var/lib/fake-boot/calls.log").content_string.splitlines()
    assert calls == [
        "grub-editenv /boot/grub/grubenv list",
        f"grub-set-default {ENTRY.format(old)}",
        "update-grub",
        f"zz-fake-boot {release} /boot/vmlinuz-{release}",
        "grub-probe --target=abstraction /boot/grub",
        "grub-probe --target=fs /boot/grub",
        "grub-editenv /boot/grub/grubenv list",
        f"grub-reboot {ENTRY.format(release)}",
        f"reboot -> {release}",
        "grub-editenv /boot/grub/grubenv list",
        f"grub-set-default {ENTRY.format(release)}",
    ], "exactly one attempt; the idempotence converge neither pinned nor rebooted"


def test_new_kernel_runs_and_is_the_default(host, fact, release):
    assert host.file("/var/lib/fake-boot/running").content_string.strip() == release
    env = host.check_output("grub-editenv /boot/grub/grubenv list").splitlines()
    assert f"saved_entry={ENTRY.format(release)}" in env
    assert fact["kernel"]["default"] == release


def test_boot_units_are_in_place_before_guests(host):
    unit = host.file("/etc/systemd/system/nvidia-dev-nodes.service").content_string
    assert "pve-guests.service" in unit
    assert host.file("/etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service").exists


def test_host_userspace_came_from_role_gpu_userspace(host):
    """nvidia_open installs the host's userspace through gpu_userspace's `driver` entry point (one
    implementation for the host and CT 200): the stand-in .run ran (it exits 3 without --no-kernel-modules)
    and gpu_userspace's local fact records the version, so the idempotence converge did not re-run it."""
    assert host.file("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.71.05").exists
    smi = host.check_output("/usr/local/bin/nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert smi == "595.71.05"
    fact = json.loads(host.file("/etc/ansible/facts.d/gpu_userspace.fact").content_string)
    assert fact == {"driver_version": "595.71.05", "source": "run"}
    assert host.file("/var/cache/gpu_userspace/NVIDIA-Linux-595.71.05.run").exists
