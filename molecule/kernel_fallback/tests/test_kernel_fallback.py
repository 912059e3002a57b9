"""The kernel role never makes an untested kernel the default, and the play says why.

The boot chain is simulated (tests/doubles/fake-boot/fakeboot.py) with the real tools' semantics:
newest kernel wins when nothing is pinned, proxmox-boot-tool's pin needs a refresh, its next-boot pin
is cleared only in userspace, systemd-boot and GRUB clear their own one-shots at boot, a panic without
panic=N sits there. The old sequence (pin --next-boot without refresh, no panic=N, nothing pinned before
the .deb install) ends with the host down or on the new kernel here, so these tests fail on it.
GRUB with /boot on LVM cannot clear grub-reboot's next_entry; there the role keeps the one-shot on the EFI
system partition, which the stand-in's GRUB reads and clears at boot as the role's /etc/grub.d snippet says.
"""

import json

import pytest

NEW = "6.12.0-untested"
GRUB_HOSTS = ("panic-grub", "lvm-uefi", "lvm-bios", "zfs-refused")
# Hosts whose last attempt makes the new kernel the default (molecule.yml: fake_boot_completes).
COMPLETES = ("lvm-uefi", "lvm-bios")
ESP_ENV = "/boot/efi/gpu-node/boot.env"


HOSTS = ("panic-sdboot", "panic-grub", "check-sdboot", "lvm-uefi", "lvm-bios", "zfs-refused")


@pytest.fixture(scope="module")
def name(host):
    hostname = host.backend.get_hostname()
    if hostname not in HOSTS:
        pytest.skip(f"{hostname} is described by its own test file")
    return hostname


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
        "msg": read("/root/kernel-boot-result-0.txt"),
        "results": [read(f"/root/kernel-boot-result-{n}.txt") for n in range(3)],
        "fact": json.loads(read("/etc/ansible/facts.d/kernel.fact") or "{}"),
        "snippet": host.file("/etc/grub.d/01_gpu_node_oneshot"),
        "esp_env": host.run(f"grub-editenv {ESP_ENV} list").stdout.splitlines()
        if host.file(ESP_ENV).exists
        else None,
        "pin": read("/etc/kernel/proxmox-boot-pin"),
        "loader_conf": read("/var/lib/fake-boot/esp/loader/loader.conf"),
        "oneshot": read("/var/lib/fake-boot/efivars/LoaderEntryOneShot"),
        "grubenv": host.run("grub-editenv /boot/grub/grubenv list").stdout.splitlines()
        if host.exists("grub-editenv")
        else [],
    }


def test_each_attempt_says_what_happened(name, state):
    old = state["old"]
    came_back = f"{NEW} did not come up: the host booted {old}"
    want = {
        "panic-sdboot": [came_back],
        "panic-grub": [came_back],
        "check-sdboot": ["`modprobe nvidia` exited 1"],
        # Panics; boots but `test -e /root/gpu-ok` fails; passes.
        "lvm-uefi": [came_back, "`test -e /root/gpu-ok` exited 1", "OK"],
        # Hangs (the watchdog resets it); chosen by hand on the console, then checked and pinned.
        "lvm-bios": [came_back, "OK"],
        "zfs-refused": [f"refusing to reboot zfs-refused into {NEW}"],
    }[name]
    for n, why in enumerate(want):
        assert "UNEXPECTED" not in state["results"][n]
        assert why in state["results"][n], (n, state["results"][n])
    assert all(r == "" for r in state["results"][len(want) :]), state["results"]


def test_host_runs_the_expected_kernel(name, state):
    assert state["old"] and state["old"] != NEW
    assert state["running"] == (NEW if name in COMPLETES else state["old"])


def test_installing_the_new_package_did_not_make_it_the_default(state):
    # The role pinned the old kernel BEFORE the .deb's postinst ran the loader hook (newest wins).
    hook = f"zz-fake-boot {NEW} /boot/vmlinuz-{NEW}"
    assert hook in state["calls"]
    before = state["calls"][: state["calls"].index(hook)]
    assert any(c.startswith(("proxmox-boot-tool kernel pin", "grub-set-default")) for c in before), before
    assert state["unplanned"] == state["old"], "a power cut after the install booted the untested kernel"


def test_permanent_default(name, state):
    """The old kernel stays the default until the new one passed; then the new one (kernel.fact says so)."""
    want = NEW if name in COMPLETES else state["old"]
    if name.endswith("sdboot"):
        assert state["pin"] == want
        assert f"default proxmox-{want}.conf" in state["loader_conf"]
        assert state["oneshot"] == "", "LoaderEntryOneShot left behind"
    else:
        assert f"saved_entry={state['grub_entry'](want)}" in state["grubenv"]
        assert not any(e.startswith("next_entry=") and e != "next_entry=" for e in state["grubenv"]), state[
            "grubenv"
        ]
    if name in COMPLETES:
        assert state["fact"].get("default") == NEW
        assert state["fact"].get("fallback") == state["old"]
    else:
        assert state["fact"].get("default") != NEW


def test_no_permanent_pin_of_the_new_kernel_before_it_passed(name, state):
    bad = ("proxmox-boot-tool kernel pin " + NEW, "grub-set-default " + state["grub_entry"](NEW))
    pins = [n for n, c in enumerate(state["calls"]) if c.startswith(bad)]
    if name not in COMPLETES:
        assert not pins
        return
    # One pin, after the last attempt's new kernel came up (and, on lvm-uefi, after its check passed).
    assert len(pins) == 1
    last = max(n for n, c in enumerate(state["calls"]) if c.startswith("attempt "))
    assert f"reboot -> {NEW}" in state["calls"][last : pins[0]]


def test_esp_one_shot_where_grub_cannot_write_boot(name, state):
    """/boot on LVM: the one-shot went to the ESP's environment block, never to /boot/grub/grubenv, and GRUB
    left it cleared; the snippet that reads it is in grub.cfg."""
    if name not in ("lvm-uefi", "lvm-bios"):
        assert state["esp_env"] is None
        assert not state["snippet"].exists
        return
    # Cleared: by GRUB at boot (save_env keeps "next_entry="), or unset by the role's rescue.
    esp_env = state["esp_env"]
    assert esp_env is not None and all(e == "next_entry=" for e in esp_env), esp_env
    assert not any(c.startswith("grub-reboot ") for c in state["calls"])
    assert state["snippet"].mode == 0o755
    cfg = state["grub_cfg"]
    assert "search --no-floppy --fs-uuid --set=gpu_node_esp 7a3c-1f0e" in cfg
    begin = cfg.index("### BEGIN /etc/grub.d/01_gpu_node_oneshot ###")
    assert cfg.index("### END /etc/grub.d/00_header") < begin < cfg.index("### BEGIN /etc/grub.d/10_linux")


def test_grub_entries_come_from_the_generated_menu(name, state):
    """The entries the role handed to grub-set-default/grub-reboot are ids grub-mkconfig wrote on this
    Proxmox VE host, not a title made up from a template (GRUB would boot entry 0, the newest kernel)."""
    if name not in GRUB_HOSTS:
        pytest.skip("systemd-boot")
    cfg = state["grub_cfg"]
    assert "menuentry 'Proxmox VE GNU/Linux, with Linux " in cfg
    used = [c.split(" ", 1)[1] for c in state["calls"] if c.startswith(("grub-set-default ", "grub-reboot "))]
    used += [c.split("set next_entry=", 1)[1] for c in state["calls"] if " set next_entry=" in c]
    assert used, state["calls"]
    for entry in used:
        for part in entry.split(">"):
            assert f"$menuentry_id_option '{part}' {{" in cfg, (part, entry)


def test_boot_sequence_of_each_loader(name, state):
    old = state["old"]
    probe = ["grub-probe --target=abstraction /boot/grub", "grub-probe --target=fs /boot/grub"]
    esp_probe = [f"grub-probe --target={t} /boot/efi" for t in ("abstraction", "fs", "fs_uuid")]
    new_entry = state["grub_entry"](NEW)
    esp_set = f"grub-editenv {ESP_ENV} set next_entry={new_entry}"
    esp_unset = f"grub-editenv {ESP_ENV} unset next_entry"
    after_install = state["calls"][state["calls"].index(f"zz-fake-boot {NEW} /boot/vmlinuz-{NEW}") + 1 :]
    if name == "zfs-refused":
        # Refused before any reboot: the only reboot is the simulated power cut (boot_zfs.yml does the rest).
        assert after_install[:4] == [f"reboot -> {old}", "attempt 0", *probe]
        boots = [c for c in after_install if c.startswith(("reboot ", "grub-reboot", "grub-set-default"))]
        assert boots == [f"reboot -> {old}"]
        return
    expected = {
        # One-shot via systemd-boot's LoaderEntryOneShot; the panic reboots (panic=10) and the loader,
        # its one-shot consumed, boots the pinned old kernel. The role then clears the (empty) one-shot.
        "panic-sdboot": [
            f"reboot -> {old}",
            "attempt 0",
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
            "attempt 0",
            *probe,
            "grub-editenv /boot/grub/grubenv list",
            f"grub-reboot {new_entry}",
            f"reboot -> {NEW} (panic, panic=10 reboots)",
            f"reboot -> {old}",
            "grub-editenv /boot/grub/grubenv unset next_entry",
        ],
        # Boots, fails its check: the role clears the one-shot and reboots back itself.
        "check-sdboot": [
            f"reboot -> {old}",
            "attempt 0",
            "proxmox-boot-tool status",
            f"proxmox-boot-tool kernel add {NEW}",
            "proxmox-boot-tool refresh",
            f"bootctl set-oneshot proxmox-{NEW}.conf",
            f"reboot -> {NEW}",
            "bootctl set-oneshot ",
            f"reboot -> {old}",
        ],
        # /boot on LVM, UEFI: the ESP one-shot (created once, the snippet put into grub.cfg by update-grub).
        "lvm-uefi": [
            f"reboot -> {old}",
            "attempt 0",
            *probe,
            *esp_probe,
            "grub-editenv /boot/grub/grubenv list",
            f"grub-editenv {ESP_ENV} create",
            "update-grub",
            esp_set,
            f"reboot -> {NEW} (panic, panic=10 reboots)",
            f"reboot -> {old}",
            esp_unset,
            "attempt 1",
            *probe,
            *esp_probe,
            "grub-editenv /boot/grub/grubenv list",
            esp_set,
            f"reboot -> {NEW}",
            esp_unset,
            f"reboot -> {old}",
            "attempt 2",
            *probe,
            *esp_probe,
            "grub-editenv /boot/grub/grubenv list",
            esp_set,
            f"reboot -> {NEW}",
            "grub-editenv /boot/grub/grubenv list",
            f"grub-set-default {new_entry}",
        ],
        # /boot on LVM, BIOS: the hang is reset by the watchdog, GRUB had cleared the ESP's one-shot. Then a
        # boot by hand (the menu choice): the role checks the running kernel and pins it, no reboot.
        "lvm-bios": [
            f"reboot -> {old}",
            "attempt 0",
            *probe,
            *esp_probe,
            "grub-editenv /boot/grub/grubenv list",
            f"grub-editenv {ESP_ENV} create",
            "update-grub",
            esp_set,
            f"reboot -> {NEW} (hang, watchdog reset)",
            f"reboot -> {old}",
            esp_unset,
            "attempt 1",
            f"reboot -> {NEW}",
            "grub-editenv /boot/grub/grubenv list",
            f"grub-set-default {new_entry}",
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
    if name != "lvm-bios":
        assert not conf.exists
        return
    assert "RuntimeWatchdogSec=60" in conf.content_string.splitlines()
    assert "softdog" in host.file("/etc/modules-load.d/gpu-node-watchdog.conf").content_string.split()
