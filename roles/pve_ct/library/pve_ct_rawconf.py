#!/usr/bin/python
"""Ansible module: raw LXC GPU-passthrough lines in /etc/pve/lxc/VMID.conf, majors read from /proc/devices."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_ct_rawconf
short_description: Write NVIDIA passthrough lines (cgroup2 rules, bind mounts) into a Proxmox CT config
description:
  - Reads the character-device majors of C(nvidia-frontend) (or C(nvidia)), C(nvidia-uvm) and C(nvidia-caps)
    from O(proc_devices); refuses to write when one is missing (driver not loaded). Nothing is hard-coded.
  - Renders C(lxc.cgroup2.devices.allow) lines for the selected GPUs and the control, UVM and caps nodes, and
    C(lxc.mount.entry) bind mounts for each node, and keeps them at the end of the main section of O(path),
    before the first C([snapshot]) section. Lines from an older driver (other majors) are replaced.
  - Supports check mode and diff.
options:
  path: {description: The container config file (C(/etc/pve/lxc/VMID.conf))., type: path, required: true}
  proc_devices: {description: Where to read the device majors., type: path, default: /proc/devices}
  dev_dir: {description: Host directory of the NVIDIA device nodes (bind sources)., type: path, default: /dev}
  gpus: {description: GPU indices to pass through., type: list, elements: int, required: true}
  caps: {description: Also pass the C(nvidia-caps) directory (MIG)., type: bool, default: true}
  modeset: {description: Also pass C(nvidia-modeset)., type: bool, default: false}
  state: {description: Lines present or absent., type: str, default: present, choices: [present, absent]}
  state_dir:
    description: Where the lines written last are recorded (to replace them after a driver update).
    type: path
    default: /var/lib/pve_ct
"""

RETURN = r"""
lines: {description: The rendered lines., type: list, returned: always}
majors: {description: Majors read from proc_devices., type: dict, returned: always}
"""

import json  # noqa: E402 - Ansible modules document first
import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

FRONTEND_NAMES = ("nvidia-frontend", "nvidia")


def read_majors(text):
    """Map char-device name -> major from the 'Character devices:' part of /proc/devices."""
    majors = {}
    section = None
    for line in text.splitlines():
        if line.endswith(":"):
            section = line[:-1].strip()
            continue
        m = re.match(r"\s*(\d+)\s+(\S+)", line)
        if m and section == "Character devices":
            majors.setdefault(m.group(2), int(m.group(1)))
    return majors


def render(majors, gpus, dev_dir, caps=True, modeset=False):
    """The passthrough lines; raises KeyError naming the missing major."""
    front = next((majors[n] for n in FRONTEND_NAMES if n in majors), None)
    if front is None:
        raise KeyError("nvidia-frontend")
    need = ["nvidia-uvm"] + (["nvidia-caps"] if caps else [])
    for name in need:
        if name not in majors:
            raise KeyError(name)
    uvm = majors["nvidia-uvm"]
    allow = [f"c {front}:{i} rwm" for i in gpus] + [f"c {front}:255 rwm"]
    if modeset:
        allow.append(f"c {front}:254 rwm")
    allow.append(f"c {uvm}:* rwm")
    if caps:
        allow.append(f"c {majors['nvidia-caps']}:* rwm")
    nodes = [f"nvidia{i}" for i in gpus] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    if modeset:
        nodes.append("nvidia-modeset")
    lines = [f"lxc.cgroup2.devices.allow: {a}" for a in allow]
    dev_dir = dev_dir.rstrip("/")
    lines += [f"lxc.mount.entry: {dev_dir}/{n} dev/{n} none bind,optional,create=file" for n in nodes]
    if caps:
        lines.append(f"lxc.mount.entry: {dev_dir}/nvidia-caps dev/nvidia-caps none bind,optional,create=dir")
    return lines


def is_managed(line, previous):
    """A passthrough line this module owns: one it wrote before, or a bind mount of an NVIDIA node."""
    if line in previous:
        return True
    return line.startswith("lxc.mount.entry:") and re.search(r"\sdev/nvidia[\w-]*\s", line) is not None


def place(text, lines, previous=()):
    """`text` with the managed lines removed and `lines` (None: nothing) appended to the main section, i.e.
    before the first [snapshot] section. Proxmox moves '#' comments into the description when it rewrites
    the file, so no marker comments are used: the lines written last time are recorded in a state file."""
    owned = set(previous) | set(lines or ())
    out = text.splitlines()
    first_section = next((i for i, line in enumerate(out) if line.startswith("[")), len(out))
    head = [line for line in out[:first_section] if not is_managed(line, owned)]  # snapshots stay as taken
    while head and head[-1] == "":
        head.pop()
    tail = out[first_section:]
    head += list(lines or ())
    return "\n".join(head + (["", *tail] if tail else [])) + "\n"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            proc_devices=dict(type="path", default="/proc/devices"),
            dev_dir=dict(type="path", default="/dev"),
            gpus=dict(type="list", elements="int", required=True),
            caps=dict(type="bool", default=True),
            modeset=dict(type="bool", default=False),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            state_dir=dict(type="path", default="/var/lib/pve_ct"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not os.path.exists(p["path"]) and module.check_mode:  # the container itself is only planned
        module.exit_json(
            changed=True, lines=[], majors={}, msg="{} would be written once the CT exists".format(p["path"])
        )
    if not os.path.exists(p["path"]):
        module.fail_json(
            msg="{} does not exist: create the container first (pve_ct_container)".format(p["path"])
        )
    with open(p["path"]) as fh:
        before = fh.read()
    majors = {}
    lines = None
    if p["state"] == "present":
        try:
            with open(p["proc_devices"]) as fh:
                majors = read_majors(fh.read())
            lines = render(majors, p["gpus"], p["dev_dir"], p["caps"], p["modeset"])
        except OSError as exc:
            module.fail_json(msg="cannot read {}: {}".format(p["proc_devices"], exc))
        except KeyError as exc:
            module.fail_json(
                msg="refusing to write {}: no '{}' major in {} (is the NVIDIA driver loaded, with "
                "nvidia-uvm{}? run nvidia-modprobe -u -c0)".format(
                    p["path"], exc.args[0], p["proc_devices"], " and nvidia-caps" if p["caps"] else ""
                ),
                majors=majors,
            )
    record = os.path.join(p["state_dir"], os.path.basename(p["path"]) + ".rawconf.json")
    previous = []
    if os.path.exists(record):
        with open(record) as fh:
            previous = json.load(fh).get("lines", [])
    after = place(before, lines, previous)
    changed = after != before
    if changed and not module.check_mode:
        # Written in place: /etc/pve is pmxcfs, which makes each write atomic and has no chmod.
        with open(p["path"], "w") as fh:
            fh.write(after)
        os.makedirs(p["state_dir"], mode=0o700, exist_ok=True)
        with open(record, "w") as fh:
            json.dump({"path": p["path"], "lines": lines or [], "majors": majors}, fh)
    module.exit_json(
        changed=changed,
        lines=lines or [],
        majors={k: v for k, v in majors.items() if "nvidia" in k},
        diff=dict(before=before, after=after, before_header=p["path"], after_header=p["path"]),
    )


if __name__ == "__main__":
    main()
