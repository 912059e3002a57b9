#!/usr/bin/env python3
"""Run an SGLang entry point with its API key kept out of the command line and out of the journal.

    sglang_launch.py MODULE [ARGS...]     # MODULE: sglang.launch_server or sglang_router.launch_router

systemd expands ${VAR} in ExecStart= into the process's arguments (systemd.service(5), "Command lines"),
and every local user reads those in `ps`, /proc/PID/cmdline and `systemctl status`. So the units pass
no key on their command line. This launcher:

- reads the key from the unit's credential `sglang-api-key` (LoadCredential=, systemd.exec(5),
  "Credentials": systemd copies the root-only 0600 file into $CREDENTIALS_DIRECTORY, a directory only the
  service's user reads, removed when the unit stops), so it is in no process's environment: the
  environment a process was exec'd with stays readable in /proc/PID/environ for its whole life, whatever
  it later removes. SGLANG_API_KEY in the environment is still taken (and removed from what the server's
  processes inherit), for a launch outside such a unit;
- runs MODULE as `python -m MODULE ARGS --api-key KEY` would, in a child process whose sys.argv gets
  the key: sys.argv is Python's own copy, and the kernel's copy (/proc/PID/cmdline) stays the exec'd one;
- copies the child's stdout and stderr (and those of every process it starts, which inherit them) to
  its own with the key replaced by ******** before it reaches the journal: SGLang logs its whole
  ServerArgs, api_key included, at every start. The key is masked as is and in its escaped forms (repr,
  JSON), in lines of any length and across reads: the copy holds back only an end that may begin a key.

The exit status is the child's, and when a signal ended the child the launcher ends by the same signal
(systemd counts a service killed by SIGTERM as stopped cleanly, an exit code of 143 as failed); SIGTERM
and SIGINT sent to the launcher are passed on to the child. Once the child has exited, output still coming
from processes it left behind is copied for a few seconds more; systemd then stops what remains of the
unit's control group. Without a key the module runs in this process, unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import signal
import sys
import threading

KEY_ENV = "SGLANG_API_KEY"
CREDENTIAL = "sglang-api-key"  # LoadCredential=sglang-api-key:PATH in the unit
MASK = b"********"
DRAIN_S = 3.0  # seconds to copy output of processes that outlive the server


def _run_module(module: str, args: list[str]) -> None:
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _child(module: str, args: list[str], write_fd: int) -> None:
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    code = 0
    try:
        _run_module(module, args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # report it as `python -m` would, then exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def key_forms(key: str) -> list[bytes]:
    """The key as a log line can hold it: as is, as repr() writes it (SGLang logs its ServerArgs with %r), and
    as JSON writes it (with and without ASCII escapes). Longest first, so a form that holds another is masked
    whole."""
    forms = {key, repr(key)[1:-1], json.dumps(key)[1:-1], json.dumps(key, ensure_ascii=False)[1:-1]}
    return sorted({f.encode("utf-8", "surrogatepass") for f in forms if f}, key=len, reverse=True)


def redact(buf: bytes, forms: list[bytes]) -> tuple[bytes, bytes]:
    """Mask every form of the key in buf. Returns what can be written now and the tail to hold back: the
    longest end of buf that begins some form, which the next read may complete. Lines play no part, so a
    line of any length, or a key split across reads, is masked all the same."""
    for form in forms:
        buf = buf.replace(form, MASK)
    keep = 0
    for form in forms:
        for n in range(min(len(form) - 1, len(buf)), keep, -1):
            if buf.endswith(form[:n]):
                keep = n
                break
    return buf[: len(buf) - keep], buf[len(buf) - keep :]


def _copy_redacted(read_fd: int, forms: list[bytes]) -> None:
    """Copy read_fd to stdout until every writer has closed it, with each form of the key masked."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            out, pending = redact(pending + chunk, forms)
            if out:
                os.write(1, out)
        if pending:  # the output ended inside what begins the key: that start is masked too
            os.write(1, MASK)


def read_key() -> str:
    """The API key: the unit's credential file when systemd passed one, else $SGLANG_API_KEY; "" = none.
    Either way SGLANG_API_KEY leaves the environment the server's processes inherit."""
    from_env = os.environ.pop(KEY_ENV, "")
    creds = os.environ.get("CREDENTIALS_DIRECTORY", "")
    path = os.path.join(creds, CREDENTIAL) if creds else ""
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    return from_env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        sys.stderr.write("usage: sglang_launch.py MODULE [ARGS...]\n")
        return 2
    module, args = argv[0], argv[1:]
    key = read_key()
    if not key:
        _run_module(module, args)
        return 0
    args = [*args, "--api-key", key]
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(module, args, write_fd)
    os.close(write_fd)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    copier = threading.Thread(target=_copy_redacted, args=(read_fd, key_forms(key)), daemon=True)
    copier.start()
    _, status = os.waitpid(pid, 0)
    copier.join(timeout=DRAIN_S)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # ended by a signal: end the same way, so systemd sees a stop, not a failure
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
