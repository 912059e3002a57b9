#!/usr/bin/env python3
"""Build the stand-in `sglang` and `sglang-router` wheels that molecule/sglang and the lab install with uv.

    sglang_standin_wheels.py OUTDIR --sglang-version V --router-version V [--double PATH] [--lock FILE]

Role sglang installs `sglang==V sglang-router==V` into its uv venv and runs `VENV/bin/python -m
sglang.launch_server` and `-m sglang_router.launch_router`. The real SGLang is an 11 GB install that
cannot serve on CPU, so the tests point the role's `sglang_find_links` at these two small wheels, named
and versioned like the real distributions: the role's install, its version check and the units' command
lines are the production ones. The wheels hold launch_server.py (next to this file; execs the SGLang double,
packed as sglang/_double.py) and launch_router.py. Standard library only (a wheel is a zip with
a .dist-info; PEP 427, PEP 376 RECORD).

The role installs only from a lock with hashes (`uv pip install --require-hashes`): --lock FILE writes the
stand-ins' lock, both pins with the sha256 of the wheels just built, in the form `uv pip compile
--generate-hashes` writes, for the tests' and the lab's sglang_requirements_lock.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOUBLE = HERE.parent / "sglang_server.py"


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build(out: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """Write DIST-VERSION-py3-none-any.whl holding files ({archive path: content}) and return its path."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
        f"Summary: STAND-IN for {dist} (tests and lab of role sglang; not {dist})\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: sglang_standin_wheels\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{name},{_digest(data)},{len(data)}" for name, data in sorted(files.items())]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = out / f"{norm}-{version}-py3-none-any.whl"
    tmp = path.with_suffix(".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in sorted(files.items()):
            # Fixed timestamps: the same inputs give the same bytes, so re-running does not change the file.
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    if path.exists() and path.read_bytes() == tmp.read_bytes():
        tmp.unlink()
    else:
        tmp.replace(path)
    return path


def write_lock(path: Path, wheels: dict[str, tuple[str, Path]]) -> None:
    """Write the requirements file with hashes of wheels ({dist: (version, wheel)}), if it differs."""
    lines = [
        "# STAND-IN lock (tests and lab of role sglang), written by sglang_standin_wheels.py --lock:",
        "# the stand-in wheels' sha256, installed with uv pip install --require-hashes as the real lock is.",
    ]
    for dist, (version, wheel) in wheels.items():
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        lines += [f"{dist}=={version} \\", f"    --hash=sha256:{digest}"]
    text = "\n".join(lines) + "\n"
    if not (path.exists() and path.read_text() == text):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--sglang-version", required=True)
    p.add_argument("--router-version", required=True)
    p.add_argument("--double", type=Path, default=DOUBLE)
    p.add_argument("--lock", type=Path, help="also write the wheels' requirements file with hashes here")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    standin = HERE
    note = b'"""STAND-IN package (role sglang tests and lab); see launch_*.py."""\n'
    built = [
        build(
            a.out,
            "sglang",
            a.sglang_version,
            {
                "sglang/__init__.py": note + f'__version__ = "{a.sglang_version}"\n'.encode(),
                "sglang/launch_server.py": (standin / "launch_server.py").read_bytes(),
                "sglang/_double.py": a.double.read_bytes(),
            },
        ),
        build(
            a.out,
            "sglang-router",
            a.router_version,
            {
                "sglang_router/__init__.py": note,
                "sglang_router/launch_router.py": (standin / "launch_router.py").read_bytes(),
            },
        ),
    ]
    for w in built:
        print(w)
    if a.lock:
        write_lock(a.lock, {"sglang": (a.sglang_version, built[0]),
                            "sglang-router": (a.router_version, built[1])})
        print(a.lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
