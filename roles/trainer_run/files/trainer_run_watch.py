#!/usr/bin/env python3
"""Follow a trainer-run unit to its end and record the rank processes it ran (role trainer_run, -e wait=true).

    trainer_run_watch.py UNIT TIMEOUT_S [INTERVAL_S]

Polls `systemctl show UNIT` until the unit is no longer active (or TIMEOUT_S passes) and, on every poll,
lists the processes of this invocation of the unit (INVOCATION_ID in their environment, which systemd
sets for the service and its children inherit) that carry torchrun's RANK / WORLD_SIZE. Prints one JSON
object: {"state", "timed_out", "ranks": {RANK: [pid, ...]}, "world_sizes": [...]}. Standard library only;
run as root (other users' /proc/PID/environ is private).
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


def rank_processes(invocation: str) -> list[tuple[int, str, str]]:
    """(pid, RANK, WORLD_SIZE) of every process of this invocation that torchrun started as a rank."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"INVOCATION_ID", b"").decode() == invocation and b"RANK" in env and b"LOCAL_RANK" in env:
            out.append((int(name), env[b"RANK"].decode(), env.get(b"WORLD_SIZE", b"").decode()))
    return out


def main(argv: list[str]) -> int:
    unit, timeout = argv[0], float(argv[1])
    interval = float(argv[2]) if len(argv) > 2 else 0.5
    deadline = time.monotonic() + timeout
    ranks: dict[str, set[int]] = {}
    worlds: set[str] = set()
    state = show(unit, "ActiveState")
    while state in ACTIVE and time.monotonic() < deadline:
        invocation = show(unit, "InvocationID")
        for pid, rank, world in rank_processes(invocation) if invocation else []:
            ranks.setdefault(rank, set()).add(pid)
            worlds.add(world)
        time.sleep(interval)
        state = show(unit, "ActiveState")
    print(
        json.dumps(
            {
                "state": state,
                "timed_out": state in ACTIVE,
                "ranks": {r: sorted(p) for r, p in sorted(ranks.items(), key=lambda kv: int(kv[0]))},
                "world_sizes": sorted(w for w in worlds if w),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
