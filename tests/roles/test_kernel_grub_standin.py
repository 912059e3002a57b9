"""The molecule GRUB stand-in (tests/doubles/fake-boot/fakeboot.py) behaves as GRUB does on Proxmox VE.

The kernel_fallback scenario proves the role safe only if its GRUB machine is not kinder than GRUB: it
must write the menu grub-mkconfig writes on PVE 8/9 (the same entries as the samples of
test_kernel_grub_entries.py, built from the real templates), boot entry 0 (the newest kernel) for an
entry it cannot find, and keep next_entry where GRUB cannot save its environment (/boot on LVM).
The role's ESP one-shot (roles/kernel/templates/01_gpu_node_oneshot.j2, rendered here as the role renders
it) must boot the new kernel once and come back on the saved entry, on UEFI and on BIOS.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from jinja2 import Environment, FileSystemLoader, StrictUndefined

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests/doubles/fake-boot/fakeboot.py"
TEMPLATES = REPO / "roles/kernel/templates"
ESP_UUID = "7A3C-1F0E"
ENV = "gpu-node/boot.env"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


samples = _load("kernel_grub_samples", REPO / "tests/roles/test_kernel_grub_entries.py")
kernel_grub = samples.kernel_grub
NEW, OLD8, OLD9 = samples.NEW, samples.OLD8, samples.OLD9


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A stand-in machine under tmp_path: make(pve, boot, kernels, disable_submenu) -> the module."""
    monkeypatch.setenv("FAKE_BOOT_ROOT", str(tmp_path))

    def make(pve, boot, kernels, disable_submenu=False, firmware="uefi", esp=False):
        (tmp_path / "var/lib/fake-boot").mkdir(parents=True)
        (tmp_path / "etc/default/grub.d").mkdir(parents=True)
        (tmp_path / "boot").mkdir()
        dist = (
            "GRUB_DISTRIBUTOR=`( . /etc/os-release && echo ${NAME} )`"
            if pve == 9
            else "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`"
        )
        (tmp_path / "etc/default/grub").write_text(
            f'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n{dist}\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n'
            + ("GRUB_DISABLE_SUBMENU=y\n" if disable_submenu else "")
        )
        (tmp_path / "etc/default/grub.d/proxmox-ve.cfg").write_text('GRUB_DISTRIBUTOR="Proxmox VE"\n')
        lvm = boot == "lvm"
        uuid = samples.LVM_UUID if lvm else samples.PLAIN_UUID
        (tmp_path / "var/lib/fake-boot/grub-host.json").write_text(
            json.dumps(
                {
                    "grub": "2.12" if pve == 9 else "2.06",
                    "abstraction": "lvm" if lvm else "",
                    "fs": "ext2",
                    "fs_uuid": uuid,
                    "root": "/dev/mapper/pve-root" if lvm else f"UUID={uuid}",
                    "access": (samples.ACCESS_LVM if lvm else samples.ACCESS_PLAIN).splitlines(),
                    "firmware": firmware,
                    "esp": {"path": "/boot/efi", "fs_uuid": ESP_UUID} if esp else {},
                }
            )
        )
        (tmp_path / "var/lib/fake-boot/loader").write_text("grub\n")
        if esp:
            (tmp_path / "boot/efi").mkdir()
        for k in kernels:
            (tmp_path / f"boot/vmlinuz-{k}").write_text("image\n")
        mod = _load(f"fakeboot_{pve}_{boot}", STANDIN)
        mod.update_grub([])
        return mod

    return make


def _kernels_menu(text):
    return [(e["title"], e["id"], e["path"], e["linux"]) for e in kernel_grub.kernel_grub_menu(text)]


@pytest.mark.parametrize(
    ("pve", "boot", "kernels", "disable_submenu", "sample"),
    [
        (8, "lvm", [NEW, OLD8, "6.5.13-6-pve"], False, "PVE8_LVM"),
        (9, "lvm", [NEW, OLD9], False, "PVE9_LVM_UEFI"),
        (8, "plain", [NEW, OLD8], True, "PVE8_NO_SUBMENU"),
    ],
    ids=["pve8-lvm", "pve9-lvm", "pve8-plain-nosubmenu"],
)
def test_standin_writes_the_menu_grub_mkconfig_writes(machine, pve, boot, kernels, disable_submenu, sample):
    m = machine(pve, boot, kernels, disable_submenu)
    written = _kernels_menu(m.GRUB_CFG.read_text())
    want = [e for e in _kernels_menu(getattr(samples, sample)) if "vmlinuz-" in e[3]]
    assert written == want


def _boot(m):
    rel, _cmdline = m.grub_boot()
    return rel


def test_entry_zero_is_the_newest_kernel(machine):
    m = machine(8, "plain", [OLD8, NEW])
    assert _boot(m) == NEW, "GRUB_DEFAULT=0 boots the newest kernel"


@pytest.mark.parametrize(
    "unknown",
    [
        f"Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {OLD8}",
        f"gnulinux-advanced-{samples.PLAIN_UUID}>gnulinux-{OLD8}-advanced-nope",
    ],
)
def test_unknown_saved_or_next_entry_boots_entry_zero(machine, unknown):
    m = machine(8, "plain", [OLD8, NEW])
    (m.ROOT / "etc/default/grub.d/zz.cfg").write_text("GRUB_DEFAULT=saved\n")
    m.update_grub([])
    m.grub_set_default([unknown])
    assert _boot(m) == NEW
    m.grub_reboot([unknown])
    assert _boot(m) == NEW


def test_saved_entry_and_one_shot_on_a_plain_boot(machine):
    m = machine(9, "plain", [OLD9, NEW], disable_submenu=True)
    (m.ROOT / "etc/default/grub.d/zz.cfg").write_text("GRUB_DEFAULT=saved\n")
    m.update_grub([])
    text = m.GRUB_CFG.read_text()
    m.grub_set_default([kernel_grub.kernel_grub_entry(text, OLD9)])
    assert _boot(m) == OLD9
    m.grub_reboot([kernel_grub.kernel_grub_entry(text, NEW)])
    assert _boot(m) == NEW, "the one-shot boots the new kernel"
    assert _boot(m) == OLD9, "GRUB cleared next_entry: the next boot is the saved (old) kernel"
    assert m.grubenv_read().get("next_entry") == ""


def test_one_shot_is_sticky_where_grub_cannot_save_its_environment(machine):
    """/boot on LVM: save_env fails ("diskfilter writes are not supported"), next_entry stays set and
    every later boot, a panic's reboot included, is the new kernel again."""
    m = machine(8, "lvm", [OLD8, NEW])
    (m.ROOT / "etc/default/grub.d/zz.cfg").write_text("GRUB_DEFAULT=saved\n")
    m.update_grub([])
    text = m.GRUB_CFG.read_text()
    m.grub_set_default([kernel_grub.kernel_grub_entry(text, OLD8)])
    m.grub_reboot([kernel_grub.kernel_grub_entry(text, NEW)])
    assert [_boot(m) for _ in range(3)] == [NEW, NEW, NEW]
    assert "diskfilter writes are not supported" in (m.D / "calls.log").read_text()


def test_grub_probe_reports_the_abstraction(machine, capsys):
    m = machine(8, "lvm", [OLD8])
    m.grub_probe(["--target=abstraction", "/boot/grub"])
    m.grub_probe(["-t", "fs", "/boot/grub"])
    assert capsys.readouterr().out.split() == ["lvm", "ext2"]


def _install_oneshot(m, uuid=ESP_UUID, source=None):
    """Render the role's snippet as the role does and let update-grub put it into grub.cfg."""
    if source is None:
        env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined)
        source = env.get_template("01_gpu_node_oneshot.j2").render(
            _kernel_grub_esp_uuid=uuid.lower(), _kernel_grub_esp_dir="/boot/efi", _kernel_grub_esp_env=ENV
        )
    snippet = m.ROOT / "etc/grub.d/01_gpu_node_oneshot"
    snippet.parent.mkdir(parents=True, exist_ok=True)
    snippet.write_text(source)
    snippet.chmod(0o755)
    (m.ROOT / "etc/default/grub.d/zz.cfg").write_text("GRUB_DEFAULT=saved\n")
    m.update_grub([])
    text = m.GRUB_CFG.read_text()
    m.grub_set_default([kernel_grub.kernel_grub_entry(text, OLD8)])
    m.grub_editenv(["/boot/efi/" + ENV, "create"])
    return text


@pytest.mark.parametrize("firmware", ["uefi", "bios"])
def test_esp_one_shot_boots_once_where_grub_cannot_write_boot(machine, firmware):
    """/boot on LVM: the one-shot on the ESP is cleared by GRUB before it boots the new kernel, so a panic's
    reboot comes back on the saved (old) entry."""
    m = machine(8, "lvm", [OLD8, NEW], firmware=firmware, esp=True)
    text = _install_oneshot(m)
    assert "### BEGIN /etc/grub.d/01_gpu_node_oneshot ###" in text
    assert text.index("01_gpu_node_oneshot") > text.index("END /etc/grub.d/00_header")
    envfile = m.ROOT / "boot/efi" / ENV
    assert envfile.stat().st_size == 1024
    m.grub_editenv(["/boot/efi/" + ENV, "set", "next_entry=" + kernel_grub.kernel_grub_entry(text, NEW)])
    assert envfile.stat().st_size == 1024, "grub-editenv rewrites the block at its size"
    assert [_boot(m) for _ in range(3)] == [NEW, OLD8, OLD8]
    assert m.grubenv_read(envfile) == {"next_entry": ""}
    assert "next_entry" not in m.grubenv_read(), "/boot/grub/grubenv was not used for the one-shot"


def test_grub_probe_sees_the_esp_as_fat(machine, capsys):
    m = machine(8, "lvm", [OLD8], esp=True)
    for target in ("abstraction", "fs", "fs_uuid"):
        m.grub_probe([f"--target={target}", "/boot/efi"])
    assert capsys.readouterr().out.split() == ["fat", ESP_UUID.lower()]
    with pytest.raises(SystemExit):
        m.grub_probe(["--target=fs", "/efi"])
    assert "failed to get canonical path of `/efi'" in capsys.readouterr().err


def test_update_grub_skips_a_snippet_that_is_not_executable(machine):
    m = machine(8, "lvm", [OLD8, NEW], esp=True)
    _install_oneshot(m)
    (m.ROOT / "etc/grub.d/01_gpu_node_oneshot").chmod(0o644)
    m.update_grub([])
    assert "01_gpu_node_oneshot" not in m.GRUB_CFG.read_text()


def _snippet(body):
    return "#!/bin/sh\ncat <<'EOF'\n" + body + "\nEOF\n"


@pytest.mark.parametrize(
    ("case", "body", "expect"),
    [
        # The ESP's UUID is wrong: search finds nothing, the one-shot is never read: the old kernel boots.
        ("wrong uuid", None, [OLD8, OLD8]),
        # BIOS: without `insmod fat` the stand-in's search cannot read the ESP.
        (
            "bios without insmod fat",
            "if search --no-floppy --fs-uuid --set=e 7a3c-1f0e; then\n"
            "  load_env --file ($e)/gpu-node/boot.env next_entry\n"
            '  if [ "${next_entry}" ] ; then\n    set default="${next_entry}"\n  fi\nfi',
            [OLD8, OLD8],
        ),
        # A snippet that never clears next_entry: the one-shot is sticky (the stand-in is not kinder).
        (
            "no save_env",
            "insmod fat\nif search --no-floppy --fs-uuid --set=e 7A3C-1F0E; then\n"
            "  load_env --file ($e)/gpu-node/boot.env next_entry\n"
            '  if [ "${next_entry}" ] ; then\n    set default="${next_entry}"\n  fi\nfi',
            [NEW, NEW],
        ),
    ],
)
def test_esp_one_shot_rules(machine, case, body, expect):
    m = machine(8, "lvm", [OLD8, NEW], firmware="bios", esp=True)
    if case == "wrong uuid":
        text = _install_oneshot(m, uuid="0000-0001")
    else:
        text = _install_oneshot(m, source=_snippet(body))
    m.grub_editenv(["/boot/efi/" + ENV, "set", "next_entry=" + kernel_grub.kernel_grub_entry(text, NEW)])
    assert [_boot(m) for _ in range(2)] == expect


def test_save_env_on_lvm_fails_and_the_role_snippet_logic_then_boots_the_default(machine):
    """The snippet's logic pointed at /boot/grub on LVM instead of the ESP: save_env fails ("diskfilter
    writes are not supported"), so the entry it could not clear is not booted."""
    m = machine(8, "lvm", [OLD8, NEW], esp=True)
    body = (
        "if search --no-floppy --fs-uuid --set=r " + samples.LVM_UUID + "; then\n"
        "  if load_env --file ($r)/boot/grub/grubenv oneshot; then\n"
        '    if [ "${oneshot}" ] ; then\n      set n="${oneshot}"\n      set oneshot=\n'
        "      if save_env --file ($r)/boot/grub/grubenv oneshot; then\n"
        '        set default="${n}"\n      fi\n    fi\n  fi\nfi'
    )
    text = _install_oneshot(m, source=_snippet(body))
    m.grub_editenv(["/boot/grub/grubenv", "set", "oneshot=" + kernel_grub.kernel_grub_entry(text, NEW)])
    assert _boot(m) == OLD8
    assert "grub: save_env: error: diskfilter writes are not supported" in (m.D / "calls.log").read_text()


def test_a_choice_on_the_console_boots_that_entry_once(machine):
    m = machine(9, "lvm", [OLD9, NEW], disable_submenu=True, esp=True)
    (m.ROOT / "etc/default/grub.d/zz.cfg").write_text("GRUB_DEFAULT=saved\n")
    m.update_grub([])
    m.grub_set_default([kernel_grub.kernel_grub_entry(m.GRUB_CFG.read_text(), OLD9)])
    assert m.grub_boot(f"Proxmox VE GNU/Linux, with Linux {NEW}")[0] == NEW
    assert _boot(m) == OLD9
