"""One writer per run directory: an exclusive `flock` on ``<run_dir>/run.lock`` (`RunLayout.lock`).

`run`, `train`, `prepare`, `generate` and `quickstart` hold it for as long as they write the run; a second
such command on the same run is refused with the holder's pid, host and command line instead of
interleaving metrics.jsonl or moving `latest` back. The kernel drops the lock when the holder exits, even
when it is killed (flock(2)), so a crashed run leaves nothing to clean up. The ranks torchrun starts for
a train stage do not take it: the launcher that started them holds it for them.

flock(2) locks belong to an open file description, so a second open in the same process would conflict
with the first; `hold` counts nested holds of one path in this process instead (`run` holds the lock,
then each stage asks for it again).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path


class RunBusy(Exception):
    """Another process holds the run's lock (exit 1: the verdict is "not now")."""


_held: dict[Path, tuple[int, int]] = {}  # lock path -> (fd, nesting depth) held by this process


def holder(path: Path) -> str:
    """Who holds the lock, as the holder wrote it: 'pid P on host H (COMMAND) since T'."""
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not written its name yet)"
    return (f"pid {info['pid']} on host {info.get('host', '?')} ({info.get('command', '?')}) "
            f"since {info.get('since', '?')}")


def _command_line() -> str:
    """This process's command as the user typed it (`python -m trainer` shows as its __main__.py)."""
    argv = list(sys.argv) or ["python"]
    if argv[0].endswith(os.path.join("trainer", "__main__.py")):
        argv[0] = "python -m trainer"
    return " ".join(argv)


@contextlib.contextmanager
def hold(path: Path, what: str) -> Iterator[None]:
    """Hold the exclusive lock at `path` (creating it and its directory) for the body; `RunBusy` naming
    the holder when another process has it. `what` names the run in the message."""
    path = path.absolute()
    if path in _held:
        fd, depth = _held[path]
        _held[path] = (fd, depth + 1)
        try:
            yield
        finally:
            _held[path] = (fd, _held[path][1] - 1)
        return
    made = [d for d in (path.parent, *path.parent.parents) if not d.exists()]  # deepest first
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        _unmake(path, made)
        raise RunBusy(f"{what}: in use by {holder(path)}; wait for it to end or stop it "
                      f"(lock {path})") from None
    except OSError:
        os.close(fd)
        _unmake(path, made)
        raise
    _held[path] = (fd, 1)
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command_line(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        yield
    finally:
        del _held[path]
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the flock
        _unmake(path, made)


def _unmake(path: Path, made: list[Path]) -> None:
    """Remove the directories the lock made, with the lock file, when the command wrote nothing else in
    them: a refused command (bad arguments, a placement that cannot run) leaves no run directory behind."""
    if not made:
        return
    with contextlib.suppress(OSError):
        if os.listdir(path.parent) == [path.name]:
            path.unlink()
        for d in made:  # deepest first; rmdir fails, and stops here, on any that holds something
            d.rmdir()
