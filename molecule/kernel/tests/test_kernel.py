"""The kernel role's real build (linux-source-6.12, tinyconfig + MODULES) and its safe boot.

The build is real: `make bindeb-pkg` ran in the container and its .debs were installed. The boot is
simulated: a container has no bootloader and cannot reboot, so prepare.yml installed a stand-in
proxmox-boot-tool and a stand-in reboot (tests/doubles/fake-boot) that keep the pin state and log
every call. The fallback path is covered by the kernel_fallback scenario.
"""
import json

import pytest

CACHE = "/var/cache/gpu-node/kernel"


@pytest.fixture(scope="module")
def fact(host):
    f = host.file("/etc/ansible/facts.d/kernel.fact")
    assert f.exists, "the kernel role wrote no kernel.fact"
    return json.loads(f.content_string)


@pytest.fixture(scope="module")
def release(fact):
    rel = fact["release"]
    assert rel.startswith("6.12.") and rel.endswith("-molecule"), rel
    return rel


def test_bindeb_pkg_produced_image_and_headers(host, fact, release):
    files = host.check_output(f"ls {CACHE}/debs/{fact['cache_key']}").split()
    debs = [f for f in files if f.endswith(".deb")]
    packages = {host.check_output(f"dpkg-deb -f {CACHE}/debs/{fact['cache_key']}/{d} Package") for d in debs}
    assert {f"linux-image-{release}", f"linux-headers-{release}"} <= packages, packages


def test_packages_installed(host, release):
    for pkg in (f"linux-image-{release}", f"linux-headers-{release}"):
        assert host.package(pkg).is_installed, pkg
    assert host.file(f"/boot/vmlinuz-{release}").is_file
    assert host.file(f"/lib/modules/{release}/build").exists, "headers give nvidia_open a build tree"


def test_config_has_fragments_and_forced_options(host, fact):
    config = host.file(f"{CACHE}/debs/{fact['cache_key']}/config").content_string.splitlines()
    for line in ("CONFIG_MODULES=y", "CONFIG_MODULE_UNLOAD=y", "CONFIG_64BIT=y", "CONFIG_BLK_DEV_INITRD=y"):
        assert line in config, line
    # Forced off: no debug info, no trusted-key file the source tree lacks (tinyconfig has neither parent).
    assert not any(ln.startswith(("CONFIG_DEBUG_INFO=y", "CONFIG_DEBUG_INFO_BTF=y")) for ln in config)
    keys = [ln for ln in config if ln.startswith("CONFIG_SYSTEM_TRUSTED_KEYS=")]
    assert keys in ([], ['CONFIG_SYSTEM_TRUSTED_KEYS=""']), keys


def test_cache_key_is_source_checksum_and_config_hash(host, fact):
    src = host.check_output("sha256sum /usr/src/linux-source-6.12.tar.xz").split()[0]
    key = fact["cache_key"]
    assert key.startswith(src[:16] + "-") and len(key) == 33, key


def test_build_tree_removed_after_success(host, fact):
    assert not host.file(f"{CACHE}/work/{fact['cache_key']}").exists


# The advanced entry's id path in the grub.cfg the stand-in grub-mkconfig wrote (plain /boot, submenu on).
UUID = "6f1d2a4e-0c0b-4d0e-9a55-3b1f2c7d8e90"
ENTRY = f"gnulinux-advanced-{UUID}>gnulinux-{{}}-advanced-{UUID}"


def test_old_pinned_before_install_new_booted_once_and_default_only_after(host, release):
    old = host.file("/var/lib/fake-boot/initial").content_string.strip()
    calls = host.file("/var/lib/fake-boot/calls.log").content_string.splitlines()
    # Exactly one attempt: the idempotence converge neither pinned nor rebooted again.
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
    ]


def test_new_kernel_runs_and_is_default(host, fact, release):
    assert host.file("/var/lib/fake-boot/running").content_string.strip() == release
    env = host.check_output("grub-editenv /boot/grub/grubenv list").splitlines()
    assert f"saved_entry={ENTRY.format(release)}" in env
    assert fact["default"] == release
    assert fact["fallback"] == host.file("/var/lib/fake-boot/initial").content_string.strip()
    assert fact["base_release"] == fact["fallback"], "the cache key must not follow the running kernel"
