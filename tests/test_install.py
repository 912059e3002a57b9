"""`pip install -e .` alone installs what the trainer imports, and pyproject.toml's torch line is the pin of
requirements/torch.txt (its owner, tests/test_one_owner.py; pip reads dependencies from pyproject.toml only).

The check is static and offline: every third-party module that trainer/ imports anywhere (function-level
imports included, the way the stages import their heavy modules) must come from a distribution that the
dependencies of [project] install, directly or through their own requirements, read from this venv's
installed metadata. Imports that are optional by design are listed with the fallback that makes them so.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# module: why `pip install -e .` may lack it
OPTIONAL = {
    "wandb": "train.wandb only; the dev and gpu extras install it (trainer/dflash/metrics.py)",
    "cryptography": "reads a server certificate's issuer; the ssl module's decoder is the fallback "
                    "(trainer/generate/endpoints.py, _name)",
}


@functools.cache
def _imported_top_levels() -> dict[str, str]:
    """{top-level module: the first file importing it} over trainer/, stdlib and trainer itself left out."""
    found: dict[str, str] = {}
    for f in sorted((ROOT / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "trainer":
                    found.setdefault(top, str(f.relative_to(ROOT)))
    return found


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return md.packages_distributions()


@functools.cache
def _closure(requirements: tuple[str, ...]) -> set[str]:
    """The distributions these requirements install, following each one's installed requirements (markers
    evaluated for this interpreter, without extras)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        # not installed here: its own requirements cannot be followed (the import check says so)
        with contextlib.suppress(md.PackageNotFoundError):
            todo += [Requirement(r) for r in md.requires(req.name) or []]
    return seen


def test_the_dependencies_install_every_module_the_trainer_imports() -> None:
    installed = _closure(tuple(PYPROJECT["dependencies"]))
    dists = _distributions()
    missing = []
    for module, where in _imported_top_levels().items():
        if module in OPTIONAL:
            continue
        names = {_norm(d) for d in dists.get(module, [])}
        if not names & installed:
            missing.append(f"{module} (imported by {where}; distribution {sorted(names) or 'not installed'})")
    assert not missing, "pyproject.toml [project] dependencies do not install: " + "; ".join(missing)


def test_the_optional_imports_are_still_imported() -> None:
    """An entry of OPTIONAL that trainer/ no longer imports is stale."""
    assert set(OPTIONAL) <= set(_imported_top_levels())


def test_pyproject_repeats_the_torch_pin_of_its_owner() -> None:
    owner = re.search(r"^torch==(\S+)", (ROOT / "requirements/torch.txt").read_text(), re.M)
    assert owner
    pins = [r for r in PYPROJECT["dependencies"] if Requirement(r).name == "torch"]
    assert pins == [f"torch=={owner.group(1)}"], (
        f"pyproject.toml's torch dependency {pins} must be requirements/torch.txt's torch=={owner.group(1)}")


@pytest.mark.parametrize("module", ["torch", "transformers", "tokenizers", "yaml", "safetensors"])
def test_the_quickstart_stack_is_a_dependency(module: str) -> None:
    """The modules the quickstart's model path needs, named so that a scan that found nothing still fails."""
    assert module in _imported_top_levels()
    dists = {_norm(d) for d in _distributions().get(module, [])}
    assert dists & _closure(tuple(PYPROJECT["dependencies"])), module
