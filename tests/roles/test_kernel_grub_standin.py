"""The molecule GRUB stand-in (molecule/kernel/fake-boot/fakeboot.py) behaves as GRUB does on Proxmox VE.

The kernel_fallback scenario proves the role safe only if its GRUB machine is not kinder than GRUB: it
must write the menu grub-mkconfig writes on PVE 8/9 (the same entries as the samples of
test_kernel_grub_entries.py, built from the real templates), boot entry 0 (the newest kernel) for an
entry it cannot find, and keep next_entry where GRUB cannot save its environment (/boot on LVM).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "molecule/kernel/fake-boot/fakeboot.py"


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

    def make(pve, boot, kernels, disable_submenu=False):
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
                }
            )
        )
        (tmp_path / "var/lib/fake-boot/loader").write_text("grub\n")
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
