"""The kernel role never makes an untested kernel the default, and the play says why.

The boot chain is simulated (molecule/kernel/fake-boot/fakeboot.py) with the real tools' semantics:
newest kernel wins when nothing is pinned, proxmox-boot-tool's pin needs a refresh, its next-boot pin
is cleared only in userspace, systemd-boot and GRUB clear their own one-shots at boot, a panic without
panic=N sits there. The old sequence (pin --next-boot without refresh, no panic=N, nothing pinned before
the .deb install) ends with the host down or on the new kernel here, so these tests fail on it.
"""

import json

import pytest

NEW = "6.12.0-untested"
GRUB_HOSTS = ("panic-grub", "hang-watchdog", "lvm-refused", "zfs-refused")


@pytest.fixture(scope="module")
def name(host):
    return host.backend.get_hostname()


@pytest.fixture(scope="module")
def state(host):
    def read(path):
        f = host.file(path)
        return f.content_string.strip() if f.exists else ""

    grub_host = json.loads(read("/var/lib/fake-boot/grub-host.json") or "{}")
    uuid = grub_host.get("fs_uuid", "")
    submenu = "GRUB_DISABLE_SUBMENU=y" not in read("/etc/default/grub").splitlines()

    def grub_entry(release):
        # What grub-mkconfig's 10_linux names the kernel's advanced entry on this host (by id).
        entry = f"gnulinux-{release}-advanced-{uuid}"
        return f"gnulinux-advanced-{uuid}>{entry}" if submenu else entry

    return {
        "grub_entry": grub_entry,
        "grub_cfg": read("/boot/grub/grub.cfg"),
        "old": read("/var/lib/fake-boot/initial"),
        "running": read("/var/lib/fake-boot/running"),
        "unplanned": read("/root/after-unplanned-reboot.txt"),
        "calls": host.file("/var/lib/fake-boot/calls.log").content_string.splitlines(),
        "msg": read("/root/kernel-boot-result.txt"),
        "pin": read("/etc/kernel/proxmox-boot-pin"),
        "loader_conf": read("/var/lib/fake-boot/esp/loader/loader.conf"),
        "oneshot": read("/var/lib/fake-boot/efivars/LoaderEntryOneShot"),
        "grubenv": host.run("grub-editenv /boot/grub/grubenv list").stdout.splitlines()
        if host.exists("grub-editenv")
        else [],
    }


def test_the_play_failed_and_says_why(name, state):
    assert "UNEXPECTED" not in state["msg"], "the role accepted a kernel that failed"
    why = {
        "panic-sdboot": f"{NEW} did not come up: the host booted {state['old']}",
        "panic-grub": f"{NEW} did not come up: the host booted {state['old']}",
        "check-sdboot": "`modprobe nvidia` exited 1",
        "hang-watchdog": f"{NEW} did not come up: the host booted {state['old']}",
        "lvm-refused": f"refusing to reboot lvm-refused into {NEW}: GRUB reaches /boot/grub through lvm",
        "zfs-refused": f"refusing to reboot zfs-refused into {NEW}: the host keeps ZFS pools rpool",
    }[name]
    assert why in state["msg"], state["msg"]


def test_host_runs_the_old_kernel(state):
    assert state["old"] and state["old"] != NEW
    assert state["running"] == state["old"]


def test_installing_the_new_package_did_not_make_it_the_default(state):
    # The role pinned the old kernel BEFORE the .deb's postinst ran the loader hook (newest wins).
    hook = f"zz-fake-boot {NEW} /boot/vmlinuz-{NEW}"
    assert hook in state["calls"]
    before = state["calls"][: state["calls"].index(hook)]
    assert any(c.startswith(("proxmox-boot-tool kernel pin", "grub-set-default")) for c in before), before
    assert state["unplanned"] == state["old"], "a power cut after the install booted the untested kernel"


def test_old_kernel_is_still_the_permanent_default(name, state):
    if name.endswith("sdboot"):
        assert state["pin"] == state["old"]
        assert f"default proxmox-{state['old']}.conf" in state["loader_conf"]
        assert state["oneshot"] == "", "LoaderEntryOneShot left behind"
    else:
        assert f"saved_entry={state['grub_entry'](state['old'])}" in state["grubenv"]
        assert not any(e.startswith("next_entry=") and e != "next_entry=" for e in state["grubenv"]), state[
            "grubenv"
        ]


def test_no_permanent_pin_of_the_new_kernel(state):
    bad = ("proxmox-boot-tool kernel pin " + NEW, "grub-set-default " + state["grub_entry"](NEW))
    assert not [c for c in state["calls"] if c.startswith(bad)]


def test_grub_entries_come_from_the_generated_menu(name, state):
    """The entries the role handed to grub-set-default/grub-reboot are ids grub-mkconfig wrote on this
    Proxmox VE host, not a title made up from a template (GRUB would boot entry 0, the newest kernel)."""
    if name not in GRUB_HOSTS:
        pytest.skip("systemd-boot")
    cfg = state["grub_cfg"]
    assert "menuentry 'Proxmox VE GNU/Linux, with Linux " in cfg
    used = [c.split(" ", 1)[1] for c in state["calls"] if c.startswith(("grub-set-default ", "grub-reboot "))]
    assert used, state["calls"]
    for entry in used:
        for part in entry.split(">"):
            assert f"$menuentry_id_option '{part}' {{" in cfg, (part, entry)


def test_boot_sequence_of_each_loader(name, state):
    old = state["old"]
    probe = ["grub-probe --target=abstraction /boot/grub", "grub-probe --target=fs /boot/grub"]
    after_install = state["calls"][state["calls"].index(f"zz-fake-boot {NEW} /boot/vmlinuz-{NEW}") + 1 :]
    expected = {
        # One-shot via systemd-boot's LoaderEntryOneShot; the panic reboots (panic=10) and the loader,
        # its one-shot consumed, boots the pinned old kernel. The role then clears the (empty) one-shot.
        "panic-sdboot": [
            f"reboot -> {old}",
            "proxmox-boot-tool status",
            f"proxmox-boot-tool kernel add {NEW}",
            "proxmox-boot-tool refresh",
            f"bootctl set-oneshot proxmox-{NEW}.conf",
            f"reboot -> {NEW} (panic, panic=10 reboots)",
            f"reboot -> {old}",
            "bootctl set-oneshot ",
        ],
        "panic-grub": [
            f"reboot -> {old}",
            *probe,
            "grub-editenv /boot/grub/grubenv list",
            f"grub-reboot {state['grub_entry'](NEW)}",
            f"reboot -> {NEW} (panic, panic=10 reboots)",
            f"reboot -> {old}",
            "grub-editenv /boot/grub/grubenv unset next_entry",
        ],
        # Boots, fails its check: the role clears the one-shot and reboots back itself.
        "check-sdboot": [
            f"reboot -> {old}",
            "proxmox-boot-tool status",
            f"proxmox-boot-tool kernel add {NEW}",
            "proxmox-boot-tool refresh",
            f"bootctl set-oneshot proxmox-{NEW}.conf",
            f"reboot -> {NEW}",
            "bootctl set-oneshot ",
            f"reboot -> {old}",
        ],
        "hang-watchdog": [
            f"reboot -> {old}",
            *probe,
            "grub-editenv /boot/grub/grubenv list",
            f"grub-reboot {state['grub_entry'](NEW)}",
            f"reboot -> {NEW} (hang, watchdog reset)",
            f"reboot -> {old}",
            "grub-editenv /boot/grub/grubenv unset next_entry",
        ],
        # Refused before any change: GRUB cannot clear next_entry on LVM. Nothing after the probe.
        "lvm-refused": [f"reboot -> {old}", *probe],
        # Refused before any reboot: the only reboot is the simulated power cut.
        "zfs-refused": [
            f"reboot -> {old}",
            *probe,
            "zpool list -H -o name",
            f"modinfo -k {NEW} -F version zfs",
        ],
    }[name]
    assert after_install == expected


def test_panic_n_is_on_the_command_line(host, name, state):
    if name.endswith("sdboot"):
        assert host.file("/etc/kernel/cmdline").content_string.split()[-1] == "panic=10"
    else:
        assert 'panic=10"' in host.file("/etc/default/grub.d/zz-gpu-node-boot.cfg").content_string


def test_unsubscribed_host_uses_pve_no_subscription(host, name):
    if name not in ("panic-sdboot", "panic-grub"):
        pytest.skip("a subscribed or non-PVE host")
    if name == "panic-sdboot":  # PVE 9: deb822
        assert "Enabled: no" in host.file("/etc/apt/sources.list.d/pve-enterprise.sources").content_string
        new = host.file("/etc/apt/sources.list.d/proxmox.sources").content_string
        assert "Components: pve-no-subscription" in new and "Suites: trixie" in new
    else:  # PVE 8: one-line .list
        old = host.file("/etc/apt/sources.list.d/pve-enterprise.list").content_string
        assert old.startswith("# deb http://enterprise.proxmox.com"), old
        new = host.file("/etc/apt/sources.list.d/pve-no-subscription.list").content_string
        # Ansible's templating drops the final newline of copy's content; apt reads the last line anyway.
        assert new.strip() == "deb http://download.proxmox.com/debian/pve bookworm pve-no-subscription"


def test_watchdog_is_armed_only_where_configured(host, name):
    conf = host.file("/etc/systemd/system.conf.d/gpu-node-watchdog.conf")
    if name != "hang-watchdog":
        assert not conf.exists
        return
    assert "RuntimeWatchdogSec=60" in conf.content_string.splitlines()
    assert "softdog" in host.file("/etc/modules-load.d/gpu-node-watchdog.conf").content_string.split()
