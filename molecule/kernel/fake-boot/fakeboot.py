#!/usr/bin/env python3
"""Stand-ins for the boot chain of a Proxmox VE host, for molecule (a container has no bootloader).

Installed under several names; argv[0] says which tool runs. Each models the real tool's semantics,
not a kinder version of it, so that a boot sequence that would hurt a real host fails here too:

proxmox-boot-tool  (proxmox-kernel-helper, src/bin/proxmox-boot-tool + src/proxmox-boot/functions)
  * `kernel pin VER [--next-boot]` (pin_kernel) only writes /etc/kernel/proxmox-boot-pin or
    /etc/kernel/next-boot-pin when ESPs are configured (/etc/kernel/proxmox-boot-uuids exists) and says
    "Use the 'refresh' command to update the ESPs"; without ESPs it calls set_grub_default with the
    next-boot pin if there is one (`pin_ver="${next_boot_ver:-$ver}"`) and runs update-grub.
  * `refresh` runs /etc/kernel/postinst.d/zz-proxmox-boot: loader.conf gets `default proxmox-VER.conf`
    for the next-boot pin if present, else the permanent pin, else `proxmox-*` (set_systemd_boot_default),
    which systemd-boot resolves to the NEWEST entry. Entries are written only for boot_kernel_list:
    running, being-installed, manual list (`kernel add`), pinned, next-boot (kernel_keep_versions); each
    entry's `options` is /etc/kernel/cmdline.
  * The next-boot pin is NOT cleared by the firmware: proxmox-boot-cleanup.service (ExecStart=
    proxmox-boot-tool kernel unpin --next-boot; ExecStart=proxmox-boot-tool refresh) does it, in
    userspace. fake-reboot runs that unit only when the kernel reached userspace, so a kernel that
    panics boots again and again.
bootctl set-oneshot ID  (systemd bootctl): sets the EFI variable LoaderEntryOneShot; systemd-boot reads
  and REMOVES it when it boots (the firmware-side one-shot). An empty ID removes it.
grub-reboot ENTRY  (grub2-common /usr/sbin/grub-reboot:157): `grub-editenv grubenv set next_entry=ENTRY`.
grub-set-default ENTRY  (/usr/sbin/grub-set-default:132-134): unset prev_saved_entry and next_entry,
  set saved_entry=ENTRY.
grub-editenv FILE list|set K=V|unset K: the grubenv block.
update-grub  (grub-mkconfig: sources /etc/default/grub then /etc/default/grub.d/*.cfg): GRUB_DEFAULT
  (empty -> 0; saved -> ${saved_entry}, 00_header:38-39) and GRUB_CMDLINE_LINUX for every entry; entries
  newest first (10_linux: version_find_latest), so GRUB_DEFAULT=0 boots the newest kernel. The generated
  config is kept as JSON in /var/lib/fake-boot/grub.json (the stand-in of /boot/grub/grub.cfg).
fake-reboot: the machine. GRUB: `next_entry` set -> boot it and clear it (00_header:68-71, grub clears
  it itself at boot), else the default. systemd-boot: LoaderEntryOneShot (consumed), else loader.conf.
  A release listed in /var/lib/fake-boot/broken panics: with panic=N (N>0) on its command line it
  reboots after N s and the loader decides again; without it the host sits at the panic (exit 1, needs
  a hand). A release in /var/lib/fake-boot/hang hangs: only a hardware watchdog (the systemd drop-in
  with RuntimeWatchdogSec= and the watchdog module to load) resets it. Five failed boots in a row stop
  the simulation: a boot loop.
Every call is appended to /var/lib/fake-boot/calls.log.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

D = Path("/var/lib/fake-boot")
ESP_LIST = Path("/etc/kernel/proxmox-boot-uuids")
PIN = Path("/etc/kernel/proxmox-boot-pin")
NEXT_PIN = Path("/etc/kernel/next-boot-pin")
MANUAL = Path("/etc/kernel/proxmox-boot-manual-kernels")
CMDLINE = Path("/etc/kernel/cmdline")
ESP = D / "esp"
ONESHOT = D / "efivars" / "LoaderEntryOneShot"
GRUBENV = Path("/boot/grub/grubenv")
GRUB_CFG = D / "grub.json"
GRUB_PIN_SNIPPET = Path("/etc/default/grub.d/proxmox-kernel-pin.cfg")
ENTRY_PREFIX = "Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux "


def log(line):
    with open(D / "calls.log", "a") as f:
        f.write(line + "\n")


def die(msg, rc=1):
    print(msg, file=sys.stderr)
    sys.exit(rc)


def first_line(p):
    return p.read_text().splitlines()[0].strip() if p.exists() and p.read_text().strip() else ""


def vkey(v):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", v)]


def installed():
    return sorted(
        (p.name[len("vmlinuz-") :] for p in Path("/boot").glob("vmlinuz-*")), key=vkey, reverse=True
    )


def running():
    return first_line(D / "running")


# ---- GRUB ------------------------------------------------------------------------------------------
def grubenv_read():
    env = {}
    if GRUBENV.exists():
        for line in GRUBENV.read_text().splitlines():
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
    return env


def grubenv_write(env):
    GRUBENV.parent.mkdir(parents=True, exist_ok=True)
    body = "# GRUB Environment Block\n" + "".join(f"{k}={v}\n" for k, v in env.items())
    GRUBENV.write_text(body + "#" * max(0, 1024 - len(body)))  # grubenv is a 1024-byte block


def grub_editenv(args):
    if len(args) < 2:
        die("usage: grub-editenv FILE list|set K=V|unset K", 2)
    env = grubenv_read()
    op, rest = args[1], args[2:]
    if op == "list":
        print("\n".join(f"{k}={v}" for k, v in env.items()))
        return
    if op == "set":
        for kv in rest:
            k, v = kv.split("=", 1)
            env[k] = v
    elif op == "unset":
        for k in rest:
            env.pop(k, None)
    else:
        die(f"grub-editenv stand-in: unsupported: {op}", 2)
    grubenv_write(env)


def grub_entry_release(entry):
    cfg = json.loads(GRUB_CFG.read_text()) if GRUB_CFG.exists() else {"entries": []}
    for e in cfg["entries"]:
        if entry in (e["title"], e["id"]):
            return e["release"]
    if entry.isdigit() and int(entry) < len(cfg["entries"]):
        return cfg["entries"][int(entry)]["release"]
    return ""


def update_grub(_args):
    # grub-mkconfig sources /etc/default/grub and then every /etc/default/grub.d/*.cfg, in shell.
    script = (
        "set -e; [ ! -f /etc/default/grub ] || . /etc/default/grub; "
        'for x in /etc/default/grub.d/*.cfg; do [ ! -e "$x" ] || . "$x"; done; '
        'printf "%s\\n%s\\n" "$GRUB_DEFAULT" "$GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT"'
    )
    out = subprocess.run(["sh", "-c", script], check=True, capture_output=True, text=True).stdout.split("\n")
    default = out[0] or "0"
    cmdline = " ".join(out[1].split())
    entries = [
        {
            "title": ENTRY_PREFIX + v,
            "id": f"gnulinux-advanced-fake>gnulinux-{v}-advanced-fake",
            "release": v,
            "cmdline": cmdline,
        }
        for v in installed()
    ]
    GRUB_CFG.write_text(json.dumps({"default": default, "entries": entries}, indent=1))
    print(f"Generating grub configuration file ... default={default}")


def grub_reboot(args):
    if not args:
        die("usage: grub-reboot MENU_ENTRY", 2)
    env = grubenv_read()
    if env.get("prev_saved_entry"):
        env["saved_entry"] = env.pop("prev_saved_entry")
    env["next_entry"] = args[0]
    grubenv_write(env)


def grub_set_default(args):
    if not args:
        die("usage: grub-set-default MENU_ENTRY", 2)
    env = grubenv_read()
    env.pop("prev_saved_entry", None)
    env.pop("next_entry", None)
    env["saved_entry"] = args[0]
    grubenv_write(env)


def grub_boot():
    """What GRUB boots now (consuming next_entry as 00_header does); returns (release, cmdline)."""
    if not GRUB_CFG.exists():
        die("fake firmware: no grub.cfg (update-grub never ran): the machine does not boot")
    cfg = json.loads(GRUB_CFG.read_text())
    env = grubenv_read()
    if env.get("next_entry"):
        entry = env["next_entry"]
        env["next_entry"] = ""  # set next_entry=; save_env next_entry
        grubenv_write(env)
    else:
        entry = env.get("saved_entry", "") if cfg["default"] == "saved" else cfg["default"]
    rel = grub_entry_release(entry) or (cfg["entries"][0]["release"] if cfg["entries"] else "")
    cmd = next((e["cmdline"] for e in cfg["entries"] if e["release"] == rel), "")
    return rel, cmd


# ---- proxmox-boot-tool / systemd-boot ---------------------------------------------------------------
def boot_kernel_list(install_version=""):
    manual = MANUAL.read_text().split() if MANUAL.exists() else []
    cand = [running(), install_version, *manual, first_line(PIN), first_line(NEXT_PIN)]
    return sorted({k for k in cand if k and (Path("/boot") / f"vmlinuz-{k}").exists()}, key=vkey)


def pbt_refresh(install_version=""):
    if not ESP_LIST.exists():
        print("No /etc/kernel/proxmox-boot-uuids found, skipping ESP sync.", file=sys.stderr)
        update_grub([])
        return
    cmdline = first_line(CMDLINE)
    if "root=" not in cmdline:
        die("No root= parameter in /etc/kernel/cmdline found!")
    entries = ESP / "loader" / "entries"
    entries.mkdir(parents=True, exist_ok=True)
    keep = boot_kernel_list(install_version)
    for k in keep:
        if not (Path("/boot") / f"initrd.img-{k}").exists():
            print(f"No initrd-image /boot/initrd.img-{k} found - skipping", file=sys.stderr)
            continue
        (entries / f"proxmox-{k}.conf").write_text(
            f"title Proxmox Virtual Environment\nversion {k}\noptions {cmdline}\n"
        )
    for e in entries.glob("proxmox-*.conf"):
        if e.name[len("proxmox-") : -len(".conf")] not in keep:
            e.unlink()  # remove_old_kernels_efi
    pinned = first_line(NEXT_PIN) or first_line(PIN)
    (ESP / "loader" / "loader.conf").write_text(
        f"timeout 3\ndefault {f'proxmox-{pinned}.conf' if pinned else 'proxmox-*'}\n"
    )


def proxmox_boot_tool(args):
    sub = " ".join(args[:2])
    if sub == "kernel pin":
        if len(args) < 3:
            die("E: <kernel-version> is mandatory")
        ver, next_boot = args[2], args[3:4] == ["--next-boot"]
        if not (Path("/boot") / f"vmlinuz-{ver}").exists():
            die(f"E: no kernel image found in /boot for '{ver}', not setting default.")
        (NEXT_PIN if next_boot else PIN).write_text(ver + "\n")
        if ESP_LIST.exists():
            pin_file = NEXT_PIN if next_boot else PIN
            print(f"Set kernel '{ver}' in {pin_file}. Use the 'refresh' command to update the ESPs.")
        else:
            pin_ver = first_line(NEXT_PIN) or ver
            GRUB_PIN_SNIPPET.parent.mkdir(parents=True, exist_ok=True)
            GRUB_PIN_SNIPPET.write_text(
                f'GRUB_DEFAULT="gnulinux-advanced-fake>gnulinux-{pin_ver}-advanced-fake"\n'
            )
            update_grub([])
    elif sub == "kernel unpin":
        NEXT_PIN.unlink(missing_ok=True)
        if args[2:3] != ["--next-boot"]:
            PIN.unlink(missing_ok=True)
        if not ESP_LIST.exists():
            pinned = first_line(PIN)
            if pinned:
                GRUB_PIN_SNIPPET.write_text(
                    f'GRUB_DEFAULT="gnulinux-advanced-fake>gnulinux-{pinned}-advanced-fake"\n'
                )
            else:
                GRUB_PIN_SNIPPET.unlink(missing_ok=True)
            update_grub([])
    elif sub == "kernel add":
        ver = args[2]
        if not (Path("/boot") / f"vmlinuz-{ver}").exists():
            die(f"E: no kernel image found in /boot for '{ver}', not adding.")
        manual = set(MANUAL.read_text().split()) if MANUAL.exists() else set()
        MANUAL.write_text("".join(f"{k}\n" for k in sorted(manual | {ver})))
    elif sub == "kernel list":
        print("Manually selected kernels:\n" + (MANUAL.read_text().strip() if MANUAL.exists() else "None."))
        if first_line(PIN):
            print(f"\nPinned kernel:\n{first_line(PIN)}")
        if first_line(NEXT_PIN):
            print(f"\nKernel pinned on next-boot:\n{first_line(NEXT_PIN)}")
    elif args[:1] == ["refresh"]:
        pbt_refresh()
    elif args[:1] == ["status"]:
        if not ESP_LIST.exists():
            die("E: /etc/kernel/proxmox-boot-uuids does not exist.", 2)
        print("System currently booted with uefi")
        for uuid in ESP_LIST.read_text().split():
            vers = ", ".join(
                sorted(p.name[8:-5] for p in (ESP / "loader" / "entries").glob("proxmox-*.conf"))
            )
            print(f"{uuid} is configured with: uefi (versions: {vers})")
    else:
        die(f"proxmox-boot-tool stand-in: unsupported: {' '.join(args)}", 2)


def bootctl(args):
    if args[:1] != ["set-oneshot"] or len(args) != 2:
        die(f"bootctl stand-in: unsupported: {' '.join(args)}", 2)
    ONESHOT.parent.mkdir(parents=True, exist_ok=True)
    if args[1]:
        ONESHOT.write_text(args[1] + "\n")
    else:
        ONESHOT.unlink(missing_ok=True)


def sdboot_boot():
    conf = ESP / "loader" / "loader.conf"
    if not conf.exists():
        die("fake firmware: no loader.conf on the ESP (refresh never ran): the machine does not boot")
    entries = {e.name: e for e in (ESP / "loader" / "entries").glob("proxmox-*.conf")}
    want = first_line(ONESHOT)
    ONESHOT.unlink(missing_ok=True)  # systemd-boot removes LoaderEntryOneShot when it reads it
    if want not in entries:
        default = re.search(r"^default (\S+)", conf.read_text(), re.M).group(1)
        match = sorted(
            (n for n in entries if re.fullmatch(default.replace(".", r"\.").replace("*", ".*"), n)),
            key=lambda n: vkey(n[8:-5]),
        )
        if not match:
            die("fake firmware: no boot entry matches the default: the machine does not boot")
        want = match[-1]  # systemd-boot sorts by version and picks the newest match
    text = entries[want].read_text()
    return re.search(r"^version (\S+)", text, re.M).group(1), re.search(r"^options (.*)$", text, re.M).group(
        1
    )


# ---- the machine ------------------------------------------------------------------------------------
def watchdog_armed():
    conf = (
        " ".join(p.read_text() for p in Path("/etc/systemd/system.conf.d").glob("*.conf"))
        if Path("/etc/systemd/system.conf.d").exists()
        else ""
    )
    return bool(re.search(r"^RuntimeWatchdogSec=([1-9]\d*)", conf, re.M))


def listed(name, rel):
    p = D / name
    return p.exists() and rel in p.read_text().split()


def fake_reboot(_args):
    loader = first_line(D / "loader")
    for _attempt in range(5):
        rel, cmd = sdboot_boot() if loader == "systemd-boot" else grub_boot()
        if listed("broken", rel):
            m = re.search(r"(?:^| )panic=(-?\d+)", cmd)
            if not m or m.group(1) == "0":
                log(f"reboot -> {rel} (panic, no panic=N: the host sits at the panic)")
                (D / "running").write_text("(down)\n")
                die(f"fake-reboot: {rel} panicked and nothing reboots it (no panic=N): needs a hand")
            log(f"reboot -> {rel} (panic, panic={m.group(1)} reboots)")
            continue
        if listed("hang", rel):
            if not watchdog_armed():
                log(f"reboot -> {rel} (hang, no watchdog)")
                (D / "running").write_text("(down)\n")
                die(f"fake-reboot: {rel} hung and no watchdog resets it: needs a hand")
            log(f"reboot -> {rel} (hang, watchdog reset)")
            continue
        (D / "running").write_text(rel + "\n")
        log(f"reboot -> {rel}")
        if NEXT_PIN.exists() and Path("/usr/local/sbin/proxmox-boot-tool").exists():
            # proxmox-boot-cleanup.service, ConditionPathExists=/etc/kernel/next-boot-pin, in userspace
            NEXT_PIN.unlink()
            pbt_refresh()
            log("proxmox-boot-cleanup.service: unpin --next-boot, refresh")
        return
    (D / "running").write_text("(down)\n")
    log("boot loop")
    die("fake-reboot: five failed boots in a row (boot loop): needs a hand")


def kernel_postinst(args):
    """/etc/kernel/postinst.d hook run by a kernel .deb's postinst: VERSION IMAGE."""
    ver = args[0] if args else ""
    if ESP_LIST.exists():
        pbt_refresh(ver)
    else:
        update_grub([])


TOOLS = {
    "proxmox-boot-tool": proxmox_boot_tool,
    "bootctl": bootctl,
    "grub-reboot": grub_reboot,
    "grub-set-default": grub_set_default,
    "grub-editenv": grub_editenv,
    "update-grub": update_grub,
    "fake-reboot": fake_reboot,
    "zz-fake-boot": kernel_postinst,
}

if __name__ == "__main__":
    name = os.path.basename(sys.argv[0])
    if name not in TOOLS:
        die(f"fakeboot: unknown tool name {name}", 2)
    if name not in ("fake-reboot",):
        log(" ".join([name, *sys.argv[1:]]))
    TOOLS[name](sys.argv[1:])
