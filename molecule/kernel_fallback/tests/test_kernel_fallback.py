"""The kernel role never makes an untested kernel the default, and the play says why.

Bootloader and reboot are simulated (molecule/kernel/fake-boot): a container has neither. The
stand-ins keep the same state a real one would (one-shot pin consumed by the next boot, a default
entry, a panic that resets to the default), and log every call, so the order of calls is checked.
"""
import pytest

NEW = "6.12.0-untested"


@pytest.fixture(scope="module")
def state(host):
    def read(name):
        f = host.file(f"/var/lib/fake-boot/{name}")
        return f.content_string.strip() if f.exists else ""

    return {
        "old": read("initial"),
        "default": read("default"),
        "running": read("running"),
        "next": read("next"),
        "calls": read("calls.log").splitlines(),
        "msg": host.file("/root/kernel-boot-result.txt").content_string,
    }


def test_the_play_failed(state):
    assert "UNEXPECTED" not in state["msg"], "the role accepted a kernel that failed its checks"
    assert f"kernel: {NEW} was NOT made the default" in state["msg"], state["msg"]


def test_default_entry_never_changed_and_host_runs_the_old_kernel(state):
    assert state["old"] and state["old"] != NEW
    assert state["default"] == state["old"]
    assert state["running"] == state["old"]
    assert state["next"] == "", "a one-shot pin was left behind"
    assert f"the host now runs {state['old']}." in state["msg"], state["msg"]


def test_no_permanent_pin_was_attempted(state):
    pins = ("proxmox-boot-tool kernel pin", "grub-set-default")
    permanent = [c for c in state["calls"] if c.startswith(pins) and "--next-boot" not in c]
    assert permanent == [], permanent


def test_call_sequence_of_each_bootloader(host, state):
    old = state["old"]
    expected = {
        # Boots, fails `modprobe nvidia`: the role clears the one-shot pin and reboots back itself.
        "fallback-proxmox": [
            f"proxmox-boot-tool kernel pin {NEW} --next-boot",
            f"reboot -> {NEW}",
            "proxmox-boot-tool kernel unpin --next-boot",
            f"reboot -> {old}",
        ],
        # Panics: the one-shot entry was consumed, the reset comes back on the default by itself.
        "fallback-grub": [
            f"grub-reboot Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {NEW}",
            f"reboot -> {NEW} (panic, watchdog reset)",
            f"reboot -> {old}",
            "grub-editenv - unset next_entry",
        ],
    }[host.backend.get_hostname()]
    assert state["calls"] == expected


def test_the_message_says_why(host, state):
    why = {
        # The real default check: no NVIDIA module can load here, and the message says which check failed.
        "fallback-proxmox": "`modprobe nvidia` exited 1",
        "fallback-grub": f"{NEW} did not come up: the host booted {state['old']}",
    }[host.backend.get_hostname()]
    assert why in state["msg"], state["msg"]
