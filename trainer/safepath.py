"""Turn names that come from outside into local paths that stay inside their directory.

S3 object keys, the file names of a model repository and the shard names in a sidecar are written by
someone else, and joined as they are they can land anywhere: pathlib drops everything before an
absolute part (`dest / "/etc/cron.d/x"` is `/etc/cron.d/x`, and S3 stores a key `prefix//etc/cron.d/x`
as readily as any other), `..` climbs out of the directory, and a symlink already inside it may point
elsewhere. Every writer checks the name before anything is written:

- `inside(root, name)`: `root / name` for a relative, '/'-separated name, refused when the name is
  empty, absolute, has an empty, `.` or `..` part, a backslash or a NUL byte, or when the resolved
  path (symlinks followed) is not below the resolved root;
- `check_relative(name)`: the same checks on the name alone, for a name not yet tied to a directory;
- `check_name(name)`: one plain file name (no `/` either), such as a shard name.

A refusal is an `UnsafePathError` (a ValueError) whose message names the name and the directory.
Standard library only and no import from the trainer package: role sglang copies this file next to
its model helper on nodes where the package is not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["UnsafePathError", "check_name", "check_relative", "inside"]


class UnsafePathError(ValueError):
    """A name that would leave its directory; `.name`, `.root` (None when there is none) and `.reason`."""

    def __init__(self, name: object, root: Path | str | None, reason: str) -> None:
        self.name, self.root, self.reason = name, root, reason
        where = f" under {root}" if root is not None else ""
        super().__init__(f"refusing {name!r}{where}: {reason}")


def _problem(name: object) -> str | None:
    """Why `name` is not a safe relative '/'-separated path, or None."""
    if not isinstance(name, str):
        return f"a name must be a string, not {type(name).__name__}"
    if not name:
        return "the name is empty"
    if "\x00" in name:
        return "the name holds a NUL byte"
    if "\\" in name:
        return "the name holds a backslash"
    if name.startswith("/"):
        return "the name is an absolute path"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"the name has {f'a {part!r}' if part else 'an empty'} path segment"
    return None


def check_relative(name: str, root: Path | str | None = None) -> str:
    """`name` when it is a relative path that cannot climb out of a directory, else UnsafePathError."""
    reason = _problem(name)
    if reason is not None:
        raise UnsafePathError(name, root, reason)
    return name


def check_name(name: str, root: Path | str | None = None) -> str:
    """`name` when it is one plain file name (no `/`, no `.` or `..`), else UnsafePathError."""
    check_relative(name, root)
    if "/" in name:
        raise UnsafePathError(name, root, "a file name cannot hold '/'")
    return name


def inside(root: Path | str, name: str) -> Path:
    """`root / name`, refused (UnsafePathError) unless it stays below `root` once symlinks are resolved."""
    check_relative(name, root)
    path = Path(root, name)
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real == real_root:
        raise UnsafePathError(name, root, "it resolves to the directory itself")
    if os.path.commonpath([real_root, real]) != real_root:
        raise UnsafePathError(name, root, f"it resolves to {real}, outside {real_root}")
    return path
