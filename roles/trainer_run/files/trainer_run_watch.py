#!/usr/bin/env python3
"""Follow a trainer-run unit to its end and record the rank processes it ran (role trainer_run, -e wait=true).

    trainer_run_watch.py UNIT TIMEOUT_S [INTERVAL_S]

Polls `systemctl show UNIT` until the unit is no longer active (or TIMEOUT_S passes) and, on every poll,
walks the process tree under the unit's main process (PPid from /proc/PID/stat, the command line from
/proc/PID/cmdline, both readable without ptrace rights; /proc/PID/environ is not, in a container) to the
torchrun launcher (`python -m torch.distributed.run`); its direct children are the ranks (their own
children, e.g. data loader workers, are not). Prints one JSON object: {"state", "timed_out",
"ranks": [pid, ...] (every rank process seen), "max_concurrent": N (most ranks alive at one poll),
"launcher": "torchrun command line"}. Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ACTIVE = {"active", "activating", "deactivating", "reloading"}


def show(unit: str, prop: str) -> str:
    r = subprocess.run(
        ["systemctl", "show", "-p", prop, "--value", unit], capture_output=True, text=True, check=False
    )
    return r.stdout.strip()


def processes() -> dict[int, tuple[int, str]]:
    """{pid: (ppid, command line)} of every process visible now."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
        out[int(name)] = (ppid, cmd)
    return out


def ranks_under(main_pid: int, procs: dict[int, tuple[int, str]]) -> tuple[str, list[int]]:
    """(torchrun command line, its child pids) for the torchrun process below main_pid ("", [] if none)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    todo = [main_pid]
    while todo:
        pid = todo.pop()
        cmd = procs.get(pid, (0, ""))[1]
        if "torch.distributed.run" in cmd or "torchrun" in cmd.split(" ", 2)[:2]:
            return cmd, sorted(children.get(pid, []))
        todo += children.get(pid, [])
    return "", []


def main(argv: list[str]) -> int:
    unit, timeout = argv[0], float(argv[1])
    interval = float(argv[2]) if len(argv) > 2 else 0.5
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    most, launcher = 0, ""
    state = show(unit, "ActiveState")
    while state in ACTIVE and time.monotonic() < deadline:
        main_pid = int(show(unit, "MainPID") or 0)
        if main_pid:
            cmd, ranks = ranks_under(main_pid, processes())
            if ranks:
                launcher = cmd
                seen.update(ranks)
                most = max(most, len(ranks))
        time.sleep(interval)
        state = show(unit, "ActiveState")
    result = {
        "state": state,
        "timed_out": state in ACTIVE,
        "ranks": sorted(seen),
        "max_concurrent": most,
        "launcher": launcher,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
