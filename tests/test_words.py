"""The repository speaks to its users: no words that only its authors understand, no pointer to a file
that is not there.

Every text file of the checkout that git knows or would add (`git ls-files --cached --others
--exclude-standard`) is read, and each finding is named file:line:
- words about the repository's history rather than the product: another team's runs ("the seeds",
  "seeds'"; `seed`/`seeds` as random seeds are fine), issue numbers ("issue 16");
- documents that are not in the repository (MACHINE.md, DFLASH.md, anything under a `shared/` folder
  beside the checkout);
- repository paths (`roles/kernel/README.md`, `tests/doubles/pve_api.py`, `files/runs/`) that name no
  file or folder, looked up from the repository root and from the referring file's folder upwards (a
  role's `files/x` is the role's); paths with placeholders (`NAME`, `*`, `{name}`, `<x>`) are skipped;
- dotted names in the trainer package (`trainer.dflash.arch.resolve_arch`) whose module is not there or
  does not define the name.
"""
from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()

WORDS = [
    (re.compile(r"\bthe seeds\b|\bseeds'|\bseeds_disaster|dflash-seeds", re.I), "another team's runs"),
    (re.compile(r"\bissues? #?\d+\b", re.I), "an issue number"),
    (re.compile(r"\b(?:MACHINE|DFLASH|DESIGN|STYLE)\.md\b"), "a document outside the repository"),
    (re.compile(r"(?<![\w-])shared/"), "a folder outside the repository"),
    (re.compile(r"pve_api_lab_hook"), "a file that is not there (tests/doubles/pve_api_lab.py has the hook)"),
]
# The one reference to something beside the checkout that stays: where the Proxmox VE API schema, which
# the repository does not keep, is looked for (tests/roles/pve_schema.py documents it).
ALLOWED = {("tests/roles/pve_schema.py", "../shared/data/pve-apidata.json")}

TOP = "bench|bin|docs|files|inventory|molecule|playbooks|requirements|roles|tests|trainer|\\.ci"
PATH = re.compile(rf"(?<![\w./~$@:-])((?:{TOP})/[\w./+@*{{}}<>$%\[\]-]*)")
# A path is checked when it looks like one: a file with an extension, a folder with a trailing slash, or
# two or more levels (`trainer/naive` in a printed ratio is not a path).
PATHLIKE = re.compile(r"\.\w+$|/$|/.+/")
PLACEHOLDER = re.compile(r"[*{}<>$%\[\]]|(?:^|/)[A-Z][A-Z_]+(?:[./]|$)|\.\.\.|/N(?:/|$)|NNN")
DOTTED = re.compile(r"(?<![\w./-])(trainer(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w-])")
BINARY_SUFFIXES = {".gpg", ".asc", ".gz", ".zst", ".png", ".jpg", ".whl"}


def repo_files() -> list[str]:
    if not shutil.which("git") or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout (git ls-files)")
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return sorted(f for f in set(out.split("\0")) if f and (REPO / f).is_file())


def text_lines(rel: str) -> list[str]:
    path = REPO / rel
    if path.suffix in BINARY_SUFFIXES:
        return []
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return []


def resolves(rel: str, target: str) -> bool:
    """`target` names something from the repository root, or from the folder of `rel` or one above it."""
    target = target.rstrip(".,:;")
    if (REPO / target).exists() or ignored(target):
        return True
    base = (REPO / rel).parent
    while base != REPO:
        if (base / target).exists():
            return True
        base = base.parent
    return False


@functools.cache
def ignored(target: str) -> bool:
    """A path git ignores is one the user makes (inventory/example/group_vars/all/vault.yml)."""
    return any(subprocess.run(["git", "check-ignore", "-q", "--no-index", t], cwd=REPO).returncode == 0
               for t in (target, target.rstrip("/") + "/"))  # a folder rule (x/) matches x/ only


@functools.cache
def module_names(module: str) -> set[str] | None:
    """The names module `module` of the trainer package defines at top level (not those it imports: a
    reference names where a thing lives); None if there is no such module."""
    path = REPO / module.replace(".", "/")
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not path.is_file():
        return None
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    if path.name == "__init__.py":
        names.update(p.stem for p in path.parent.iterdir() if p.suffix == ".py" or p.is_dir())
    return names


def dotted_ok(ref: str) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):  # the longest prefix that is a module, then one name in it
        names = module_names(".".join(parts[:i]))
        if names is not None:
            return i == len(parts) or parts[i] in names
    return False


def findings() -> list[str]:
    out = []
    for rel in repo_files():
        if rel == SELF:
            continue
        for n, line in enumerate(text_lines(rel), 1):
            where = f"{rel}:{n}"
            for pattern, what in WORDS:
                for m in pattern.finditer(line):
                    if not any(rel == f and a in line for f, a in ALLOWED):
                        out.append(f"{where}: {m.group(0)!r}: {what}")
            for m in PATH.finditer(line):
                target = m.group(1)
                if not PATHLIKE.search(target) or PLACEHOLDER.search(target) or resolves(rel, target):
                    continue
                out.append(f"{where}: {target!r} names no file or folder of the repository")
            for m in DOTTED.finditer(line):
                if not dotted_ok(m.group(1)):
                    out.append(f"{where}: {m.group(1)!r} is not defined in the trainer package")
    return out


def test_no_insider_words_and_no_dangling_references() -> None:
    found = findings()
    assert not found, "\n" + "\n".join(found)


def test_the_checks_can_fail() -> None:
    """Each kind of finding is found (so the test above can fail)."""
    lines = ["the seeds' run", "see issue 17", "(MACHINE.md)", "../shared/DFLASH.md", "pve_api_lab_hook.py"]
    assert [any(p.search(x) for p, _ in WORDS) for x in lines] == [True] * len(lines)
    assert not any(p.search("per-micro-batch seeds, seed: 0") for p, _ in WORDS)
    assert not resolves("README.md", "roles/nope/README.md")
    assert resolves("README.md", "roles/kernel/README.md")
    assert resolves("roles/gpu_userspace/defaults/main.yml", "files/uv-requirements.txt")
    assert PLACEHOLDER.search("files/runs/NAME.yml") and not PLACEHOLDER.search("files/runs/tiny.yml")
    assert not dotted_ok("trainer.dflash.drafter.resolve_arch")
    assert dotted_ok("trainer.dflash.arch.resolve_arch")
    assert dotted_ok("trainer.layout.RunLayout") and not dotted_ok("trainer.nope")
