"""trainer/safepath.py: names from outside (S3 keys, repository file names, sidecar shard names) joined onto
a local directory never leave it, on the real filesystem (symlinks included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer.safepath import UnsafePathError, check_name, check_relative, inside

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../x", "'..' path segment"),
        ("a/../../x", "'..' path segment"),
        ("a/..", "'..' path segment"),
        ("/etc/x", "absolute path"),
        ("//etc/x", "absolute path"),
        ("a//b", "an empty path segment"),
        ("a/", "an empty path segment"),
        (".", "'.' path segment"),
        ("a/./b", "'.' path segment"),
        ("", "the name is empty"),
        ("a\\..\\..\\x", "backslash"),
        ("a\x00b", "NUL byte"),
    ],
)
def test_inside_refuses_names_that_could_leave_root(tmp_path: Path, name: str, why: str) -> None:
    with pytest.raises(UnsafePathError, match=why) as exc:
        inside(tmp_path, name)
    assert repr(name) in str(exc.value) and str(tmp_path) in str(exc.value), "names the name and directory"
    assert exc.value.name == name and exc.value.root == tmp_path
    assert isinstance(exc.value, ValueError)
    with pytest.raises(UnsafePathError, match=why):
        check_relative(name)


def test_inside_refuses_a_symlink_in_root_that_points_out(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "sub").symlink_to(outside)
    (root / "file").symlink_to(outside / "f")  # a dangling link to a file outside
    (root / "self").symlink_to(root)
    with pytest.raises(UnsafePathError, match=rf"resolves to {outside}/x\.safetensors, outside {root}"):
        inside(root, "sub/x.safetensors")
    with pytest.raises(UnsafePathError, match="outside"):
        inside(root, "file")
    with pytest.raises(UnsafePathError, match="the directory itself"):
        inside(root, "self")
    assert inside(root, "self/a") == root / "self" / "a"  # a link that stays inside is fine


def test_inside_accepts_plain_relative_names(tmp_path: Path) -> None:
    assert inside(tmp_path, "a/b.safetensors") == tmp_path / "a" / "b.safetensors"
    assert inside(str(tmp_path), "model.safetensors") == tmp_path / "model.safetensors"
    assert inside(tmp_path, "..a/b..c/.hidden") == tmp_path / "..a" / "b..c" / ".hidden"
    # a root that is itself reached through a symlink
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert inside(tmp_path / "link", "x/y") == tmp_path / "link" / "x" / "y"


def test_check_name_takes_one_plain_file_name() -> None:
    assert check_name("part-00000-1a2b3c.jsonl.zst") == "part-00000-1a2b3c.jsonl.zst"
    for bad in ("../x", "a/b", "/x", ".", "..", "", "a\\b"):
        with pytest.raises(UnsafePathError, match=repr(bad).replace("\\", "\\\\").replace(".", "\\.")):
            check_name(bad)
    with pytest.raises(UnsafePathError, match="must be a string, not int"):
        check_name(7)  # type: ignore[arg-type]


def test_the_module_stands_alone() -> None:
    """Role model copies it next to model_fetch.py on nodes without the trainer package: run with no
    site-packages and only its own directory on the path, it imports and works."""
    code = (
        "import safepath, sys\n"
        "try:\n    safepath.inside('/tmp', '../x')\nexcept safepath.UnsafePathError as e:\n    print(e)\n"
        "print(sorted(m for m in sys.modules if m.startswith('trainer')))\n"
    )
    r = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=ROOT / "trainer", capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["refusing '../x' under /tmp: the name has a '..' path segment", "[]"]
