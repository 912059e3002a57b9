"""Role sglang's compiler check (roles/sglang/files/sglang_cc_check.py): what Triton needs to build
its launcher.

The check builds and loads a C extension against this Python's Python.h with the compiler Triton would
pick ($CC, else gcc, else clang on PATH), through Triton itself when it is installed. Without a compiler
it must fail naming the missing compiler; molecule/sglang runs the same check on the node, with and
without gcc on PATH.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "roles/sglang/files/sglang_cc_check.py"
HAS_BUILD_TOOLS = (
    shutil.which("gcc") is not None and (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()
)


def _check(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK)], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_without_gcc_on_path_the_check_fails_naming_the_compiler() -> None:
    r = _check(PATH="/nonexistent")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no C compiler for Triton" in r.stderr
    assert "neither gcc nor clang is on PATH (/nonexistent)" in r.stderr
    assert "install gcc, libc6-dev and python3-dev (sglang_build_packages)" in r.stderr


def test_a_cc_that_does_not_exist_is_named() -> None:
    r = _check(PATH=os.environ.get("PATH", ""), CC="/nonexistent/cc")
    assert r.returncode == 1
    assert "C compiler /nonexistent/cc (from CC) not found" in r.stderr


@pytest.mark.skipif(not HAS_BUILD_TOOLS, reason="needs gcc and Python.h of this Python")
def test_with_gcc_and_headers_the_check_builds_and_loads_the_extension() -> None:
    r = _check(PATH=os.environ.get("PATH", ""))
    assert r.returncode == 0, r.stderr
    include = sysconfig.get_paths()["include"]
    triton = importlib.util.find_spec("triton") is not None
    expected = "built and loaded a C extension" + ("" if triton else " as Triton does")
    assert expected in r.stdout
    assert r.stdout.rstrip().endswith(f"against {include}")
