"""Find a kernel's GRUB menu entry in the grub.cfg that grub-mkconfig generated on the host.

grub-reboot and grub-set-default take a menu entry as GRUB itself resolves it (grub-core/normal/menu.c,
get_and_remove_first_entry_number + menuentry_eq): a number, or a path of titles or ids separated by
`>` (`>>` is a literal `>`), one component per submenu level. An entry that matches nothing is entry 0,
which 10_linux makes the NEWEST kernel (its list is version-sorted, newest first). A title built from a
template is therefore dangerous: 10_linux names entries after GRUB_DISTRIBUTOR ("Proxmox VE GNU/Linux,
with Linux 6.8.12-9-pve" on Proxmox VE, whose /etc/default/grub.d/proxmox-ve.cfg sets it), so a
"Debian GNU/Linux, ..." title silently boots the newest kernel. The entry is read from the file instead.

10_linux (GRUB 2.06 and 2.12, util/grub.d/10_linux.in, linux_entry) writes, per kernel VERSION:
  menuentry 'OS, with Linux VERSION' ... $menuentry_id_option 'gnulinux-VERSION-advanced-FSUUID' {
  menuentry 'OS, with Linux VERSION (recovery mode)' ... 'gnulinux-VERSION-recovery-FSUUID' {
inside `submenu 'Advanced options for OS' $menuentry_id_option 'gnulinux-advanced-FSUUID' {` unless
GRUB_DISABLE_SUBMENU is y/yes/true, plus one top-level `menuentry 'OS' ... 'gnulinux-simple-FSUUID'`
for the newest kernel only. The simple entry follows whichever kernel is newest, so it is never used
here: the advanced entry names one kernel for good. The path is built from the ids (grub-mkconfig's own
advice for GRUB_DEFAULT: "gnulinux-advanced-$boot_device_id>gnulinux-$version-$type-$boot_device_id").
"""

from __future__ import annotations

import re
import shlex

_OPEN = re.compile(r"^\s*(menuentry|submenu)\s+(.*?)\s*\{\s*$")
_FUNCTION = re.compile(r"^\s*function\s+\S+\s*\{\s*$")
_LINUX = re.compile(r"^\s*linux(?:efi)?\s+(\S+)")


def _words(args: str) -> list[str]:
    """Split a menuentry/submenu line as GRUB's script lexer does for single-quoted words."""
    try:
        return shlex.split(args, posix=True)
    except ValueError:
        return args.split()


def _title_and_id(args: str) -> tuple[str, str]:
    words = _words(args)
    title = words[0] if words else ""
    entry_id = ""
    for i, w in enumerate(words[1:-1], start=1):
        if w in ("$menuentry_id_option", "${menuentry_id_option}", "--id"):
            entry_id = words[i + 1]
    return title, entry_id


def kernel_grub_menu(text: str) -> list[dict]:
    """Every menuentry of a grub.cfg: title, id, its submenu path (list of (title, id)), kernel image."""
    entries: list[dict] = []
    stack: list[dict] = []  # open blocks: submenus, menuentries, functions
    for line in text.splitlines():
        m = _OPEN.match(line)
        if m:
            title, entry_id = _title_and_id(m.group(2))
            block = {"kind": m.group(1), "title": title, "id": entry_id, "linux": ""}
            if block["kind"] == "menuentry":
                block["path"] = [(b["title"], b["id"]) for b in stack if b["kind"] == "submenu"]
                entries.append(block)
            stack.append(block)
            continue
        if _FUNCTION.match(line):
            stack.append({"kind": "function"})
            continue
        if line.strip() == "}":
            if stack:
                stack.pop()
            continue
        m = _LINUX.match(line)
        if m and stack and stack[-1]["kind"] == "menuentry" and not stack[-1]["linux"]:
            stack[-1]["linux"] = m.group(1)
    return [{"title": e["title"], "id": e["id"], "path": e["path"], "linux": e["linux"]} for e in entries]


def _component(title: str, entry_id: str) -> str:
    return (entry_id or title).replace(">", ">>")


def _rank(entry: dict, release: str) -> int:
    """0: 10_linux's advanced entry of this release, 1: another normal entry booting it, -1: not it."""
    if entry["linux"].rsplit("/", 1)[-1] != f"vmlinuz-{release}":
        return -1
    if entry["id"].startswith("osprober-"):
        return -1  # a kernel of another installed system (30_os-prober), maybe the same version
    if entry["id"].startswith(f"gnulinux-{release}-advanced-"):
        return 0
    if "-recovery-" in entry["id"] or (entry["title"].endswith(")") and " (" in entry["title"]):
        return -1  # recovery mode ("single" on the command line) or another variant
    if entry["id"].startswith("gnulinux-simple-"):
        return -1  # follows the newest kernel, not this one
    return 1


def kernel_grub_entry(text: str, release: str) -> str:
    """The grub-reboot/grub-set-default argument that boots RELEASE, or "" when grub.cfg has none."""
    best = None
    for e in kernel_grub_menu(text or ""):
        r = _rank(e, release)
        if r >= 0 and (best is None or r < best[0]):
            best = (r, e)
    if best is None:
        return ""
    e = best[1]
    return ">".join([*(_component(t, i) for t, i in e["path"]), _component(e["title"], e["id"])])


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        return {"kernel_grub_entry": kernel_grub_entry, "kernel_grub_menu": kernel_grub_menu}
