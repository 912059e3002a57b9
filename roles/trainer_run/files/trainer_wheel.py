#!/usr/bin/env python3
"""Build this repository's `trainer` wheel on the controller (role trainer_run).

    trainer_wheel.py digest SRC          # sha256 of what goes into the wheel (pyproject, README, trainer/**)
    trainer_wheel.py build SRC OUTDIR    # build from a clean copy; prints {"wheel": PATH, "digest": D}

The digest decides whether a node's installed wheel is current, so a second playbook run installs
nothing. The build copies the sources to a temporary directory first, so the working tree gets no
build/ or egg-info litter, and runs `python -m pip wheel --no-deps --no-build-isolation` (setuptools from
the controller's environment: no download).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TOP_FILES = ("pyproject.toml", "README.md")


def sources(src: Path) -> list[Path]:
    """The files a wheel is built from, sorted, caches excluded."""
    if not (src / "pyproject.toml").is_file():
        raise SystemExit(
            f"trainer_wheel: {src}/pyproject.toml not found (trainer_run_src_dir must be the repo root)"
        )
    files = [src / f for f in TOP_FILES if (src / f).is_file()]
    files += sorted(
        p
        for p in (src / "trainer").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    return files


def digest(src: Path) -> str:
    h = hashlib.sha256()
    for p in sources(src):
        h.update(p.relative_to(src).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def build(src: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trainer-wheel-") as tmp:
        for p in sources(src):
            dest = Path(tmp) / p.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)
        for old in out.glob("trainer-*.whl"):
            old.unlink()
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            tmp,
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise SystemExit(f"trainer_wheel: pip wheel failed ({r.returncode}):\n{r.stderr[-3000:]}")
    wheels = sorted(out.glob("trainer-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(
            f"trainer_wheel: expected one trainer wheel in {out}, found {[w.name for w in wheels]}"
        )
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="build the trainer wheel on the controller")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("digest")
    d.add_argument("src", type=Path)
    b = sub.add_parser("build")
    b.add_argument("src", type=Path)
    b.add_argument("out", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "digest":
        print(digest(a.src))
    else:
        wheel = build(a.src, a.out)
        print(json.dumps({"wheel": str(wheel), "digest": digest(a.src)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
