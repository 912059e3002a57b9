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
grub-editenv FILE create|list|set K=V|unset K  (util/grub-editenv.c): an environment block file
  (lib/envblk.c format: "# GRUB Environment Block" line, K=V lines, '#' padding to the file's size;
  create writes a fresh 1024-byte one, DEFAULT_ENVBLK_SIZE; a missing FILE is created implicitly). From
  Linux it writes through the mounted filesystem, so it works on LVM too; only GRUB cannot, see below.
grub-probe --target=abstraction|fs|fs_uuid PATH: what GRUB sees at PATH, as install.yml described the
  host (fake_grub_boot: plain -> no abstraction, fs ext2; lvm -> abstraction lvm; fake_grub_esp: a vfat
  EFI system partition mounted there -> no abstraction, fs fat, fs_uuid as grub-core/fs/fat.c prints it,
  "%04x-%04x", lower case). A PATH that does not exist: "failed to get canonical path", exit 1.
update-grub  (grub-mkconfig): writes /boot/grub/grub.cfg as Debian's 00_header and 10_linux write it
  on Proxmox VE 8 (GRUB 2.06) and 9 (GRUB 2.12), from /etc/default/grub and /etc/default/grub.d/*.cfg
  (proxmox-ve.cfg: GRUB_DISTRIBUTOR="Proxmox VE"): titles 'Proxmox VE GNU/Linux, with Linux V', ids
  gnulinux-V-advanced-FSUUID, the submenu 'Advanced options for Proxmox VE GNU/Linux' unless
  GRUB_DISABLE_SUBMENU=y, entry 0 = the newest kernel (update_grub cites each rule).
update-grub also runs every EXECUTABLE /etc/grub.d script other than 00_header and 10_linux (which
  it models itself) in name order and puts its output between "### BEGIN/END /etc/grub.d/NAME ###"
  (util/grub-mkconfig.in: `test -x "$i"`); a script that fails fails update-grub.
fake-reboot [--pick ENTRY]: the machine. GRUB: 00_header's next_entry block boots next_entry and clears
  it with save_env, which fails where GRUB cannot write /boot/grub (LVM, md-raid: "diskfilter writes are
  not supported"; ZFS, btrfs): there next_entry stays and boots again and again. Else the default
  (GRUB_DEFAULT, ${saved_entry} for saved). Then the script that the other /etc/grub.d snippets put
  between 00_header and 10_linux runs (grub_script: insmod, search --fs-uuid --set=VAR, load_env and
  save_env --file with a variable list, set, `if CMD; then`/`if [ "${VAR}" ]; then`/else/fi; anything
  else stops the stand-in: it does not guess). load_env/save_env follow grub-core/commands/loadenv.c:
  the file must exist and carry the envblk signature ("invalid environment block"), load_env with names
  sets only those, save_env rewrites the file in place at its size ("environment block too small") and
  fails on a device GRUB cannot write: the ESP (vfat on a GPT partition, through efidisk/biosdisk) is
  writable, LVM is not. search --fs-uuid compares case-insensitively (grub-core/commands/search.c) and
  finds the ESP only with the fat module loaded; under BIOS (grub-host.json firmware=bios) the stand-in
  needs an explicit `insmod fat` (core.img carries only what reaches /boot/grub; real GRUB's normal mode
  may also autoload it, normal/autofs.c, so this is stricter), under UEFI Debian's signed image has fat
  built in (debian/build-efi-images). --pick ENTRY: someone chooses ENTRY in the menu on the console for
  this boot (the one-shot logic above still runs first). Entries are resolved as grub-core/normal/menu.c
  does: title or id per `>` level; an unknown entry boots entry 0, the newest kernel.
  systemd-boot: LoaderEntryOneShot (consumed), else loader.conf.
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
import shlex
import subprocess
import sys
from pathlib import Path

# FAKE_BOOT_ROOT: the simulated machine's root (unit tests run the stand-in in a temporary tree).
ROOT = Path(os.environ.get("FAKE_BOOT_ROOT", "/"))
D = ROOT / "var/lib/fake-boot"
BOOT = ROOT / "boot"
ESP_LIST = ROOT / "etc/kernel/proxmox-boot-uuids"
PIN = ROOT / "etc/kernel/proxmox-boot-pin"
NEXT_PIN = ROOT / "etc/kernel/next-boot-pin"
MANUAL = ROOT / "etc/kernel/proxmox-boot-manual-kernels"
CMDLINE = ROOT / "etc/kernel/cmdline"
ESP = D / "esp"
ONESHOT = D / "efivars" / "LoaderEntryOneShot"
GRUBENV = BOOT / "grub/grubenv"
GRUB_CFG = BOOT / "grub/grub.cfg"
# What grub-probe would find under /boot/grub: {"grub": "2.06"|"2.12", "abstraction": "lvm" or "",
# "fs": "ext2", "fs_uuid": ..., "root": the root= of 10_linux, "access": the lines of
# prepare_grub_to_access_device}; written by install.yml.
GRUB_HOST = D / "grub-host.json"
GRUB_PIN_SNIPPET = ROOT / "etc/default/grub.d/proxmox-kernel-pin.cfg"


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
    return sorted((p.name[len("vmlinuz-") :] for p in BOOT.glob("vmlinuz-*")), key=vkey, reverse=True)


def running():
    return first_line(D / "running")


# ---- GRUB ------------------------------------------------------------------------------------------
ENVBLK_SIG = "# GRUB Environment Block\n"  # include/grub/lib/envblk.h, GRUB_ENVBLK_SIGNATURE


def grubenv_read(path=None):
    path = path or GRUBENV
    env = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
    return env


def grubenv_write(env, path=None, size=None):
    """Write the block at its current size (GRUB and grub-editenv rewrite it in place), 1024 when new.
    Returns False where the variables do not fit ("environment block too small")."""
    path = path or GRUBENV
    if size is None:
        size = path.stat().st_size if path.exists() else 1024
    body = ENVBLK_SIG + "".join(f"{k}={v}\n" for k, v in env.items())
    if len(body) > size:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body + "#" * (size - len(body)))
    return True


def grub_editenv(args):
    if len(args) < 2:
        die("usage: grub-editenv FILE create|list|set K=V|unset K", 2)
    path = Path(args[0]) if Path(args[0]).is_absolute() else Path.cwd() / args[0]
    path = ROOT / path.relative_to("/")
    op, rest = args[1], args[2:]
    if op == "create":
        grubenv_write({}, path, 1024)
        return
    env = grubenv_read(path)
    if op == "list":
        for k, v in env.items():  # an empty block lists nothing
            print(f"{k}={v}")
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
    if not grubenv_write(env, path):
        die("grub-editenv: error: environment block too small.")


def grub_host():
    return json.loads(GRUB_HOST.read_text()) if GRUB_HOST.exists() else {}


def grub_esp():
    """The vfat EFI system partition install.yml described ({"path", "fs_uuid"}), or {}."""
    return grub_host().get("esp") or {}


def grub_probe(args):
    """grub-probe --target=abstraction|fs|fs_uuid PATH: what GRUB sees at PATH.

    abstraction lists the disk abstraction modules (lvm, diskfilter, mdraid1x, cryptodisk, ...) GRUB
    needs to reach the path; fs is GRUB's filesystem module (ext2 for ext2/3/4, fat for vfat)."""
    target, path = "", ""
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
        elif a.startswith("--target="):
            target = a.split("=", 1)[1]
        elif a == "-t" and i + 1 < len(args):
            target, skip = args[i + 1], True
        elif not a.startswith("-"):
            path = a
    host = grub_host()
    if target not in ("abstraction", "fs", "fs_uuid"):
        die(f"grub-probe stand-in: unsupported target {target!r}", 2)
    if not path or not (ROOT / path.lstrip("/")).exists():
        die(f"grub-probe: error: failed to get canonical path of `{path}'.")
    esp = grub_esp()
    if esp and (path == esp["path"] or path.startswith(esp["path"].rstrip("/") + "/")):
        host = {"abstraction": "", "fs": "fat", "fs_uuid": esp["fs_uuid"].lower()}
    value = host.get(target, "")
    if value:
        print(value)


def grub_unwritable():
    """Why GRUB cannot write its environment block at boot, or "".

    grub-core/commands/loadenv.c (save_env) writes the grubenv file's blocks through the disk driver;
    grub-core/disk/diskfilter.c (LVM, md-raid) refuses: "diskfilter writes are not supported". ZFS and
    btrfs give no writable block list either. Debian's 00_header (debian/patches/quick-boot.patch,
    check_writable) tests exactly this: `grub-probe --target=abstraction` diskfilter|lvm, `--target=fs`
    btrfs|cpiofs|newc|odc|romfs|squash4|tarfs|zfs."""
    host = grub_host()
    if host.get("abstraction"):
        return "diskfilter writes are not supported"
    if host.get("fs") in ("btrfs", "cpiofs", "newc", "odc", "romfs", "squash4", "tarfs", "zfs"):
        return f"{host['fs']} writes are not supported"
    return ""


def grub_defaults():
    """grub-mkconfig: source /etc/default/grub, then every /etc/default/grub.d/*.cfg, in shell."""
    names = [
        "GRUB_DEFAULT",
        "GRUB_DISTRIBUTOR",
        "GRUB_CMDLINE_LINUX",
        "GRUB_CMDLINE_LINUX_DEFAULT",
        "GRUB_DISABLE_SUBMENU",
        "GRUB_DISABLE_RECOVERY",
    ]
    etc = ROOT / "etc/default"
    script = (
        f"set -e; [ ! -f {etc}/grub ] || . {etc}/grub; "
        f'for x in {etc}/grub.d/*.cfg; do [ ! -e "$x" ] || . "$x"; done; '
        + "; ".join(f'printf "%s\\n" "${n}"' for n in names)
    )
    out = subprocess.run(["sh", "-c", script], check=True, capture_output=True, text=True).stdout.split("\n")
    return dict(zip(names, out, strict=False))


def grub_quote(s):
    # grub-mkconfig_lib grub_quote: sed "s/'/'\\\\''/g"
    return s.replace("'", "'\\''")


def update_grub(_args):
    """A grub-mkconfig of Debian's GRUB (2.06 on PVE 8/bookworm, 2.12 on PVE 9/trixie): writes
    /boot/grub/grub.cfg as 00_header and 10_linux (util/grub.d/*.in) do.

    00_header: GRUB_DEFAULT empty -> 0, saved -> ${saved_entry}; the next_entry block (load_env; if
      next_entry: default=next_entry, clear it, save_env next_entry, boot_once) comes first.
    10_linux: OS="${GRUB_DISTRIBUTOR} GNU/Linux" (Debian 2.12's mkconfig-distributor.patch keeps a
      GRUB_DISTRIBUTOR that already ends in GNU/Linux), class --class <first word, lower case>; kernels
      version-sorted newest first; the newest gets the top-level simple entry 'OS' (id
      gnulinux-simple-FSUUID) and opens submenu 'Advanced options for OS' (id gnulinux-advanced-FSUUID)
      unless GRUB_DISABLE_SUBMENU is y/yes/true; every kernel gets 'OS, with Linux V' (id
      gnulinux-V-advanced-FSUUID) and, unless GRUB_DISABLE_RECOVERY=true, 'OS, with Linux V (recovery
      mode)' (gnulinux-V-recovery-FSUUID, args "single ${GRUB_CMDLINE_LINUX}"). FSUUID is the root
      filesystem's UUID (grub_get_device_id); root= is /dev/mapper/... on LVM (uses_abstraction lvm),
      else UUID=."""
    host = grub_host()
    cfg = grub_defaults()
    default = cfg["GRUB_DEFAULT"] or "0"
    default = "${saved_entry}" if default == "saved" else default
    dist = cfg["GRUB_DISTRIBUTOR"]
    if not dist:
        os_name = "GNU/Linux"
    elif host.get("grub") == "2.12" and (dist in ("Ubuntu", "Kubuntu") or dist.endswith("GNU/Linux")):
        os_name = dist
    else:
        os_name = f"{dist} GNU/Linux"
    cls = (
        f"--class {re.sub(r'[^A-Za-z0-9_]', '_', dist.split()[0].lower())} " if dist else ""
    ) + "--class gnu-linux --class gnu --class os"
    uuid = host.get("fs_uuid", "00000000-0000-0000-0000-000000000000")
    root = host.get("root", f"UUID={uuid}")
    access = host.get("access", ["insmod part_gpt", "insmod ext2"])
    args = " ".join(f"{cfg['GRUB_CMDLINE_LINUX']} {cfg['GRUB_CMDLINE_LINUX_DEFAULT']}".split())
    rec_args = " ".join(f"single {cfg['GRUB_CMDLINE_LINUX']}".split())
    submenu = cfg["GRUB_DISABLE_SUBMENU"] not in ("y", "yes", "true")
    out = [
        "#",
        "# DO NOT EDIT THIS FILE",
        "#",
        "# It is automatically generated by grub-mkconfig using templates",
        "# from /etc/grub.d and settings from /etc/default/grub",
        "#",
        "",
        "### BEGIN /etc/grub.d/00_header ###",
        "if [ -s $prefix/grubenv ]; then",
        "  set have_grubenv=true",
        "  load_env",
        "fi",
        'if [ "${next_entry}" ] ; then',
        '   set default="${next_entry}"',
        "   set next_entry=",
        "   save_env next_entry",
        "   set boot_once=true",
        "else",
        f'   set default="{default}"',
        "fi",
        "",
        "function savedefault {",
        '  if [ -z "${boot_once}" ]; then',
        '    saved_entry="${chosen}"',
        "    save_env saved_entry",
        "  fi",
        "}",
        "### END /etc/grub.d/00_header ###",
        "",
    ]
    snippets = sorted(
        p
        for p in (ROOT / "etc/grub.d").glob("*")
        if p.is_file()
        and os.access(p, os.X_OK)
        and p.name not in ("00_header", "10_linux")
        and not p.name.endswith("~")
    )

    def run_snippets(names):
        for p in names:
            done = subprocess.run([str(p)], capture_output=True, text=True)
            if done.returncode:
                die(f"update-grub: /etc/grub.d/{p.name} failed: {done.stderr.strip()}")
            out.extend(
                [
                    f"### BEGIN /etc/grub.d/{p.name} ###",
                    *done.stdout.splitlines(),
                    f"### END /etc/grub.d/{p.name} ###",
                    "",
                ]
            )

    run_snippets([p for p in snippets if p.name < "10_linux"])
    out.append("### BEGIN /etc/grub.d/10_linux ###")

    def entry(title, entry_id, version, entry_args, indent):
        body = [
            f"menuentry '{grub_quote(title)}' {cls} $menuentry_id_option '{entry_id}' {{",
            "\tload_video",
            "\tinsmod gzio",
            "\tif [ x$grub_platform = xxen ]; then insmod xzio; insmod lzopio; fi",
            *(f"\t{a}" for a in access),
            f"\techo\t'Loading Linux {version} ...'",
            f"\tlinux\t/boot/vmlinuz-{version} root={root} ro {entry_args}".rstrip(),
            "\techo\t'Loading initial ramdisk ...'",
            f"\tinitrd\t/boot/initrd.img-{version}",
            "}",
        ]
        return [indent + ln for ln in body]

    indent = ""
    for n, v in enumerate(installed()):
        if n == 0 and submenu:
            out += entry(os_name, f"gnulinux-simple-{uuid}", v, args, "")
            out.append(
                f"submenu 'Advanced options for {grub_quote(os_name)}' $menuentry_id_option "
                f"'gnulinux-advanced-{uuid}' {{"
            )
            indent = "\t"
        out += entry(f"{os_name}, with Linux {v}", f"gnulinux-{v}-advanced-{uuid}", v, args, indent)
        if cfg["GRUB_DISABLE_RECOVERY"] != "true":
            title = f"{os_name}, with Linux {v} (recovery mode)"
            out += entry(title, f"gnulinux-{v}-recovery-{uuid}", v, rec_args, indent)
    if indent:
        out.append("}")
    out += ["", "### END /etc/grub.d/10_linux ###", ""]
    run_snippets([p for p in snippets if p.name > "10_linux"])
    GRUB_CFG.parent.mkdir(parents=True, exist_ok=True)
    GRUB_CFG.write_text("\n".join(out))
    print("Generating grub configuration file ...", file=sys.stderr)


_GRUB_ITEM = re.compile(
    r"^\s*(menuentry|submenu) '((?:[^']|'\\'')*)'.*?(?:\$menuentry_id_option '([^']*)')? \{$"
)


def grub_menu():
    """GRUB's reading of grub.cfg: (default expression, menu tree of menuentry/submenu items)."""
    text = GRUB_CFG.read_text()
    default = re.findall(r'^\s*set default="(.*)"\s*$', text, re.M)
    default = [d for d in default if d != "${next_entry}"]
    top = {"children": []}
    stack = [top]
    for line in text.splitlines():
        m = _GRUB_ITEM.match(line)
        if m:
            item = {"kind": m[1], "title": m[2].replace("'\\''", "'"), "id": m[3] or "", "children": []}
            stack[-1]["children"].append(item)
            stack.append(item)
        elif re.match(r"^\s*function \S+ \{$", line):
            stack.append({"children": []})
        elif line.strip() == "}":
            stack.pop()
        elif stack[-1].get("kind") == "menuentry" and re.match(r"^\s*linux\s", line):
            stack[-1]["linux"] = line.split(None, 2)[1:]
    return (default[0] if default else "0"), top["children"]


def grub_pick(items, spec):
    """grub-core/normal/menu.c: a number, or title-or-id matched one `>` component at a time (`>>` is a
    literal `>`, menuentry_eq); a submenu gets the rest as its default. "If DEFAULT_ENTRY is not within
    the menu entries, fall back to the first entry" (run_menu): an unknown entry boots entry 0."""
    parts = re.split(r"(?<!>)>(?!>)", spec, maxsplit=1) if spec else [""]
    head, rest = parts[0].replace(">>", ">"), (parts[1] if len(parts) > 1 else "")
    if head.isdigit():
        idx = int(head)
    else:
        idx = next((i for i, it in enumerate(items) if head and head in (it["title"], it["id"])), -1)
    if not 0 <= idx < len(items):
        idx, rest = 0, ""
    item = items[idx]
    return grub_pick(item["children"], rest) if item["kind"] == "submenu" else item


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


class GrubScriptError(Exception):
    pass


def grub_device_path(spec, variables):
    """(DEVICE)/PATH with $VAR/${VAR} expanded -> (writable, host path) of the file GRUB opens."""
    spec = re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m[1], ""), spec)
    m = re.fullmatch(r"\(([^)]*)\)(/.*)", spec)
    if not m:
        raise GrubScriptError(f"stand-in: only (DEVICE)/PATH files are modelled, not {spec!r}")
    esp = grub_esp()
    if esp and m[1] == "esp":
        return True, ROOT / esp["path"].lstrip("/") / m[2].lstrip("/")
    if m[1] == "root":  # the /boot filesystem: writable unless a disk abstraction or unwritable fs
        return not grub_unwritable(), ROOT / m[2].lstrip("/")
    raise GrubScriptError(f"no such device: {m[1]}")  # grub-core/kern/device.c: "disk `%s' not found"


def grub_command(words, variables, modules):
    """One GRUB command; returns its success (the exit status `if` tests)."""
    cmd, args = words[0], words[1:]
    if cmd == "insmod":
        modules.update(args)
        return True
    if cmd == "set" and len(args) == 1 and "=" in args[0]:
        k, v = args[0].split("=", 1)
        variables[k] = re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m[1], ""), v.strip('"'))
        return True
    if cmd == "search":
        opts = [a for a in args if a.startswith("-")]
        rest = [a for a in args if not a.startswith("-")]
        var = next((o.split("=", 1)[1] for o in opts if o.startswith("--set=")), "root")
        if "--fs-uuid" not in opts or len(rest) != 1:
            raise GrubScriptError(f"stand-in: only search --fs-uuid --set=VAR UUID is modelled: {words}")
        host, esp = grub_host(), grub_esp()
        fat_loaded = host.get("firmware") != "bios" or "fat" in modules
        if esp and fat_loaded and rest[0].lower() == esp["fs_uuid"].lower():
            variables[var] = "esp"
            return True
        if rest[0].lower() == host.get("fs_uuid", "").lower():
            variables[var] = "root"
            return True
        log(f"grub: search: error: no such device: {rest[0]}")
        return False
    if cmd in ("load_env", "save_env"):
        if not args or args[0] not in ("--file", "-f") or len(args) < 2:
            raise GrubScriptError(f"stand-in: only {cmd} --file FILE is modelled (00_header's is built in)")
        writable, path = grub_device_path(args[1], variables)
        names = args[2:]
        if not path.is_file() or not path.read_text().startswith(ENVBLK_SIG):
            why = "file not found" if not path.is_file() else "invalid environment block"
            log(f"grub: {cmd}: error: {why}")
            return False
        env = grubenv_read(path)
        if cmd == "load_env":
            for k, v in env.items():
                if not names or k in names:
                    variables[k] = v
            return True
        if not names:
            log("grub: save_env: error: no variable is specified")
            return False
        if not writable:
            log(f"grub: save_env: error: {grub_unwritable()}")
            return False
        for k in names:
            if k in variables:
                env[k] = variables[k]
            else:
                env.pop(k, None)
        if not grubenv_write(env, path):
            log("grub: save_env: error: environment block too small")
            return False
        return True
    raise GrubScriptError(f"stand-in: unmodelled GRUB command {' '.join(words)!r}")


def grub_script(lines, variables):
    """Run the top-level script lines (outside menu entries) that /etc/grub.d snippets wrote."""
    modules = set()
    frames = []  # [parent_active, condition_result, in_else]

    def active():
        return all(f[0] and (f[1] != f[2]) for f in frames)

    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"if (.*?) ?; then", line)
        if m:
            run = active()
            cond = m[1]
            result = False
            if run:
                t = re.fullmatch(r'\[ "\$\{(\w+)\}" \]', cond)
                words = shlex.split(cond)
                result = bool(variables.get(t[1])) if t else grub_command(words, variables, modules)
            frames.append([run, result, False])
        elif line == "else":
            frames[-1][2] = True
        elif line == "fi":
            frames.pop()
        elif active():
            grub_command(shlex.split(line), variables, modules)
    if frames:
        raise GrubScriptError("stand-in: unbalanced if/fi")


def grub_boot(pick=""):
    """What GRUB boots now (00_header consumes next_entry, then the snippets run): (release, cmdline)."""
    if not GRUB_CFG.exists():
        die("fake firmware: no grub.cfg (update-grub never ran): the machine does not boot")
    default, menu = grub_menu()
    env = grubenv_read()
    variables = {}
    if env.get("next_entry"):
        variables["default"] = env["next_entry"]
        variables["boot_once"] = "true"
        why = grub_unwritable()
        if why:
            # save_env next_entry fails: GRUB prints the error and boots on; next_entry stays set.
            log(f"grub: save_env next_entry: error: {why}")
        else:
            env["next_entry"] = ""  # set next_entry=; save_env next_entry
            grubenv_write(env)
    else:
        variables["default"] = default.replace("${saved_entry}", env.get("saved_entry", ""))
    variables["next_entry"] = ""
    text = GRUB_CFG.read_text()
    between = text.split("### END /etc/grub.d/00_header ###", 1)[-1]
    between = between.split("### BEGIN /etc/grub.d/10_linux ###")[0]
    try:
        grub_script(between.splitlines(), variables)
    except GrubScriptError as e:
        die(f"fake firmware: {e}")
    spec = pick or variables["default"]
    if not menu:
        die("fake firmware: grub.cfg has no menu entry: the machine does not boot")
    item = grub_pick(menu, spec)
    image, args = (item.get("linux") or ["", ""]) + [""] * (2 - len(item.get("linux") or []))
    return image.rsplit("vmlinuz-", 1)[-1], args


# ---- proxmox-boot-tool / systemd-boot ---------------------------------------------------------------
def boot_kernel_list(install_version=""):
    manual = MANUAL.read_text().split() if MANUAL.exists() else []
    cand = [running(), install_version, *manual, first_line(PIN), first_line(NEXT_PIN)]
    return sorted({k for k in cand if k and (BOOT / f"vmlinuz-{k}").exists()}, key=vkey)


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
        if not (BOOT / f"initrd.img-{k}").exists():
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
        if not (BOOT / f"vmlinuz-{ver}").exists():
            die(f"E: no kernel image found in /boot for '{ver}', not setting default.")
        (NEXT_PIN if next_boot else PIN).write_text(ver + "\n")
        if ESP_LIST.exists():
            pin_file = NEXT_PIN if next_boot else PIN
            print(f"Set kernel '{ver}' in {pin_file}. Use the 'refresh' command to update the ESPs.")
        else:
            pin_ver = first_line(NEXT_PIN) or ver
            GRUB_PIN_SNIPPET.parent.mkdir(parents=True, exist_ok=True)
            uuid = grub_host().get("fs_uuid", "")
            GRUB_PIN_SNIPPET.write_text(
                f'GRUB_DEFAULT="gnulinux-advanced-{uuid}>gnulinux-{pin_ver}-advanced-{uuid}"\n'
            )
            update_grub([])
    elif sub == "kernel unpin":
        NEXT_PIN.unlink(missing_ok=True)
        if args[2:3] != ["--next-boot"]:
            PIN.unlink(missing_ok=True)
        if not ESP_LIST.exists():
            pinned = first_line(PIN)
            if pinned:
                uuid = grub_host().get("fs_uuid", "")
                GRUB_PIN_SNIPPET.write_text(
                    f'GRUB_DEFAULT="gnulinux-advanced-{uuid}>gnulinux-{pinned}-advanced-{uuid}"\n'
                )
            else:
                GRUB_PIN_SNIPPET.unlink(missing_ok=True)
            update_grub([])
    elif sub == "kernel add":
        ver = args[2]
        if not (BOOT / f"vmlinuz-{ver}").exists():
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
        " ".join(p.read_text() for p in (ROOT / "etc/systemd/system.conf.d").glob("*.conf"))
        if (ROOT / "etc/systemd/system.conf.d").exists()
        else ""
    )
    return bool(re.search(r"^RuntimeWatchdogSec=([1-9]\d*)", conf, re.M))


def listed(name, rel):
    p = D / name
    return p.exists() and rel in p.read_text().split()


def fake_reboot(args):
    loader = first_line(D / "loader")
    pick = args[1] if args[:1] == ["--pick"] and len(args) > 1 else ""
    for _attempt in range(5):
        rel, cmd = sdboot_boot() if loader == "systemd-boot" else grub_boot(pick)
        pick = ""  # a choice on the console is for this boot only
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
        if NEXT_PIN.exists() and (ROOT / "usr/local/sbin/proxmox-boot-tool").exists():
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
    "grub-probe": grub_probe,
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
