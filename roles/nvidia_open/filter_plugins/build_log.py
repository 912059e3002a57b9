"""Filters that turn a long kernel-module build log into the one line a person needs.

A failed `make modules` of the NVIDIA open driver prints thousands of lines (conftest probes, every
CC line, make's recursive "Error 2" trail). The first compiler diagnostic is what explains the
failure, e.g. ``nv-pci.c:237:9: error: too few arguments to function 'pci_resize_resource'``.
"""
from __future__ import annotations

import re

# gcc/clang diagnostics: "path/file.c:LINE:COL: error: message" (also "fatal error:").
_COMPILER_ERROR = re.compile(
    r"^(?P<file>[^\s:]+):(?P<line>\d+)(?::(?P<col>\d+))?: (?:fatal )?error: (?P<msg>.+)$"
)
# Linker and modpost failures: "ERROR: modpost: ..." or "ld: ...: undefined reference to ...".
_LINK_ERROR = re.compile(r"^(?:ERROR: modpost: .+|.*\bld(?:\.\w+)?: .*(?:undefined reference|error).*)$")
# make's own failure lines ("make[2]: *** [Makefile:12: foo.o] Error 1"), the last resort.
_MAKE_ERROR = re.compile(r"^make(?:\[\d+\])?: \*\*\* .+$")


def _shorten(path: str) -> str:
    """Keep the source-relative part of an absolute build path (everything after the module dir)."""
    for marker in ("/kernel-open/", "/nvidia-open-kernel/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1] if path.count("/") >= 2 else path


def nvidia_open_first_error(log: str) -> str:
    """Return the first compiler error of a build log, else the first link/modpost error, else make's.

    Falls back to the last non-empty line, or a fixed text for an empty log, so the caller always
    gets something to put in its failure message.
    """
    lines = [ln.rstrip() for ln in (log or "").splitlines()]
    for ln in lines:
        m = _COMPILER_ERROR.match(ln.strip())
        if m:
            where = _shorten(m["file"]) + ":" + m["line"] + (":" + m["col"] if m["col"] else "")
            return f"{where}: error: {m['msg']}"
    for pattern in (_LINK_ERROR, _MAKE_ERROR):
        for ln in lines:
            if pattern.match(ln.strip()):
                return ln.strip()
    tail = [ln for ln in lines if ln.strip()]
    return tail[-1].strip() if tail else "the build log is empty"


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        return {"nvidia_open_first_error": nvidia_open_first_error}
