#!/usr/bin/env python3
"""Check that Triton can build its launcher on this node: a C compiler and Python.h of this Python.

    /opt/sglang/venv/bin/python sglang_cc_check.py

Run with the SGLang venv's Python. Triton (which SGLang and torch use) compiles a small C extension, its
GPU launcher, the first time a kernel runs: it takes the compiler from $CC, else gcc, else clang on PATH,
and includes Python.h from this Python's include directory (triton/runtime/build.py, _build). Without a
compiler SGLang fails at its first Triton kernel with "Failed to find C compiler"; without the headers
with "Python.h: No such file or directory".

With Triton installed the check asks Triton itself to build and load a tiny extension
(triton.runtime.build.compile_module_from_src, in a fresh cache directory so that it really compiles).
Without Triton (stand-in installs) it follows the same rule itself: same compiler choice, same include
directory, same command (cc SRC -O3 -shared -fPIC -Wno-psabi -I<include> -o MODULE), then loads the module.

Prints what it used and exits 0; on failure prints what is missing and exits 1.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

NAME = "sglang_cc_check_ext"
SOURCE = f"""#include <Python.h>
static PyMethodDef methods[] = {{{{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "{NAME}", NULL, -1, methods}};
PyMODINIT_FUNC PyInit_{NAME}(void) {{ return PyModule_Create(&module); }}
"""
HINT = "install gcc, libc6-dev and python3-dev (sglang_build_packages)"


class CheckError(Exception):
    pass


def find_compiler() -> str:
    """Triton's choice: $CC, else gcc, else clang on PATH."""
    cc = os.environ.get("CC")
    if cc is not None:
        return cc
    cc = shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise CheckError(
            "no C compiler for Triton: CC is not set and neither gcc nor clang is on PATH "
            f"({os.environ.get('PATH', '')}); Triton fails with \"Failed to find C compiler\"; {HINT}"
        )
    return cc


def python_include() -> str:
    """Triton's include directory: this Python's, with Debian's posix_local scheme read as posix_prefix."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def diagnose(err: BaseException) -> str:
    """What is missing, from a failed build: the compiler, Python.h, or else the compiler's own error."""
    if isinstance(err, FileNotFoundError) and err.filename:
        source = " (from CC)" if err.filename == os.environ.get("CC") else ""
        return f"C compiler {err.filename}{source} not found; {HINT}"
    text = str(err)
    if isinstance(err, subprocess.CalledProcessError):
        text = (err.stderr or "").strip() or f"{err.cmd[0]} exited {err.returncode}"
    if "Failed to find C compiler" in text:
        return (
            "no C compiler for Triton: CC is not set and neither gcc nor clang is on PATH "
            f"({os.environ.get('PATH', '')}): {text}; {HINT}"
        )
    include = python_include()
    if not (Path(include) / "Python.h").is_file():
        return f"Python.h not found in {include} (the headers of {sys.executable}); {HINT}"
    return f"building a C extension against {include}/Python.h failed: {text}; {HINT}"


def load(path: str) -> None:
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise CheckError(f"cannot load the built extension {path}")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def build_without_triton(tmp: str) -> str:
    cc = find_compiler()
    include = python_include()
    src = os.path.join(tmp, f"{NAME}.c")
    so = os.path.join(tmp, NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    Path(src).write_text(SOURCE)
    cmd = [cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so, f"-I{tmp}", f"-I{include}"]
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except (FileNotFoundError, subprocess.CalledProcessError) as e:
        raise CheckError(diagnose(e)) from e
    load(so)
    return (
        f"Triton is not installed here; built and loaded a C extension as Triton does, with {cc}"
        f" against {include}"
    )


def build_with_triton(tmp: str) -> str:
    os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "cache")  # a fresh cache: Triton really compiles
    try:
        import triton
        from triton.runtime import build
    except ImportError as e:
        raise CheckError(f"triton is installed in {sys.prefix} but does not import: {e}") from e

    try:
        if hasattr(build, "compile_module_from_src"):
            build.compile_module_from_src(SOURCE, NAME)
        else:  # older Triton: _build(name, src, srcdir, library_dirs, include_dirs, libraries[, ccflags])
            src = os.path.join(tmp, f"{NAME}.c")
            Path(src).write_text(SOURCE)
            try:
                so = build._build(NAME, src, tmp, [], [], [])
            except TypeError:
                so = build._build(NAME, src, tmp, [], [], [], [])
            load(so)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        raise CheckError(diagnose(e)) from e
    cc = os.environ.get("CC") or find_compiler()
    return f"triton {triton.__version__} built and loaded a C extension with {cc} against {python_include()}"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="sglang-cc-check-") as tmp:
        try:
            if importlib.util.find_spec("triton") is None:
                print(build_without_triton(tmp))
            else:
                print(build_with_triton(tmp))
        except CheckError as e:
            print(f"sglang: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
