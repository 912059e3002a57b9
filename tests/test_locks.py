"""The hash locks the roles install (`uv pip install --require-hashes`) and the controller's venv is installed
from (bin/bootstrap: `pip install --require-hashes`) agree with their inputs.

bin/lock makes each lock with `uv pip compile --generate-hashes` from human-edited inputs. A lock that was
not regenerated after an input changed would install other versions than the inputs say, or fail on the
node; these checks catch that offline: every pin of an input is in its lock at the same version, every
entry of a lock is pinned with at least one sha256, and every entry a lock says comes from an input is
still pinned there. No network: the locks are read, not re-resolved.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TORCH_TXT = "requirements/torch.txt"
CPU_TORCH_INPUT = ".cache/lock/torch-cpu.txt"  # what bin/lock names the CPU torch pin it writes
DEV_CONSTRAINTS = "requirements/dev-constraints.txt"
CONTROLLER_LOCK = "requirements/controller.lock.txt"  # bin/bootstrap: the dev extra, torch's CPU build
CONTROLLER_CUDA_LOCK = "requirements/controller-cuda.lock.txt"  # bin/bootstrap where no CPU wheel is had
PIP_TXT = "requirements/pip.txt"
STANDINS = ROOT / "tests/doubles/standins/sglang_standin_wheels.py"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lines: list[str], where: str) -> dict[str, str]:
    """{normalized name: version} of the NAME[extras]==VERSION requirements among lines (comments dropped)."""
    pins = {}
    for line in lines:
        req = line.split("#", 1)[0].strip()
        if not req:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)(\s*;.*)?", req)
        assert m, f"{where}: {req!r} is not pinned as NAME==VERSION"
        pins[_norm(m.group(1))] = m.group(3)
    return pins


def _file_pins(rel: str) -> dict[str, str]:
    return _pins((ROOT / rel).read_text().splitlines(), rel)


def _pyproject_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return _pins(deps, "pyproject.toml [project] dependencies")


def _pyproject_dev_pins() -> dict[str, str]:
    """The pins of [project] dependencies and of the dev extra (its self-reference trainer[model] left out:
    the model extra repeats a dependency)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dev = [r for r in project["optional-dependencies"]["dev"] if not r.startswith(project["name"] + "[")]
    return _pins(project["dependencies"] + dev, "pyproject.toml [project] dependencies and the dev extra")


def _torch(local: str = "") -> dict[str, str]:
    pins = _file_pins(TORCH_TXT)
    return {"torch": pins["torch"] + local}


@dataclass
class Entry:
    version: str
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)


def _read_lock(rel: str) -> dict[str, Entry]:
    """The entries of a lock in the form uv pip compile --generate-hashes writes."""
    entries: dict[str, Entry] = {}
    current: Entry | None = None
    for n, raw in enumerate((ROOT / rel).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or (not raw[0].isspace() and line.startswith("#")):
            continue
        if not raw[0].isspace():
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)(\s*;[^\\]*)?\s*\\?", line)
            assert m, f"{rel}:{n}: {line!r} is not an entry NAME==VERSION (bin/lock writes only those)"
            current = entries.setdefault(_norm(m.group(1)), Entry(m.group(2)))
            continue
        assert current is not None, f"{rel}:{n}: {line!r} belongs to no entry"
        if line.startswith("--hash="):
            h = line.removeprefix("--hash=").rstrip(" \\")
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", h), f"{rel}:{n}: {h!r} is not a sha256"
            current.hashes.append(h)
        elif line.startswith("#"):
            via = line.lstrip("#").strip()
            via = via.removeprefix("via").strip()
            if via:
                current.via.append(via)
        else:
            raise AssertionError(f"{rel}:{n}: unexpected line {line!r}")
    assert entries, f"{rel}: no entries"
    return entries


def _sglang_defaults() -> dict[str, str]:
    d = yaml.safe_load((ROOT / "roles/sglang/defaults/main.yml").read_text())
    return {"sglang": d["sglang_version"], "sglang-router": d["sglang_router_version"]}


# lock -> {input as the lock's "# via" lines name it: its pins}
LOCKS = {
    "files/pyenv/requirements-gpu.lock.txt": lambda: {
        "-r files/pyenv/requirements-gpu.txt": _file_pins("files/pyenv/requirements-gpu.txt"),
        f"-r {TORCH_TXT}": _torch(),
        "trainer (pyproject.toml)": _pyproject_pins(),
    },
    "files/pyenv/requirements-lab.lock.txt": lambda: {
        "-r files/pyenv/requirements-lab.txt": _file_pins("files/pyenv/requirements-lab.txt"),
        f"-r {CPU_TORCH_INPUT}": _torch("+cpu"),
    },
    "files/pyenv/requirements-test.lock.txt": lambda: {
        "-r files/pyenv/requirements-test.txt": _file_pins("files/pyenv/requirements-test.txt"),
        f"-r {CPU_TORCH_INPUT}": _torch("+cpu"),
    },
    "files/sglang/requirements.lock.txt": lambda: {
        "-r files/sglang/requirements.txt": _file_pins("files/sglang/requirements.txt"),
    },
    # ==2.13.0 in pyproject is met by the CPU build 2.13.0+cpu, the version this lock holds (PEP 440)
    CONTROLLER_LOCK: lambda: {
        f"-r {CPU_TORCH_INPUT}": _torch("+cpu"),
        f"-c {DEV_CONSTRAINTS}": _file_pins(DEV_CONSTRAINTS),
        "trainer (pyproject.toml)": {**_pyproject_dev_pins(), **_torch("+cpu")},
    },
    CONTROLLER_CUDA_LOCK: lambda: {
        f"-r {TORCH_TXT}": _torch(),
        f"-c {DEV_CONSTRAINTS}": _file_pins(DEV_CONSTRAINTS),
        "trainer (pyproject.toml)": _pyproject_dev_pins(),
    },
    "requirements/pip.lock.txt": lambda: {
        f"-r {PIP_TXT}": _file_pins(PIP_TXT),
    },
}


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_entry_of_the_lock_is_pinned_with_a_hash(lock: str) -> None:
    for name, entry in _read_lock(lock).items():
        assert entry.hashes, f"{lock}: {name}=={entry.version} has no --hash (--require-hashes refuses it)"


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_pin_of_the_inputs_is_in_the_lock(lock: str) -> None:
    entries = _read_lock(lock)
    for source, pins in LOCKS[lock]().items():
        for name, version in pins.items():
            assert name in entries, f"{lock}: {name}=={version} ({source}) is missing: run bin/lock"
            assert entries[name].version == version, (
                f"{lock}: {name}=={entries[name].version}, but {source} pins {version}: run bin/lock")
            assert entries[name].hashes, f"{lock}: {name} has no --hash"


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_what_the_lock_took_from_an_input_is_still_pinned_there(lock: str) -> None:
    """An entry annotated `via -r INPUT` that INPUT no longer pins is a leftover: the lock is stale."""
    inputs = LOCKS[lock]()
    for name, entry in _read_lock(lock).items():
        for via in entry.via:
            if via.startswith(("-r ", "-c ")) or via.endswith("(pyproject.toml)"):
                assert via in inputs, f"{lock}: {name} comes from {via}, which is not an input of this lock"
                assert name in inputs[via], f"{lock}: {name} comes from {via}, which no longer pins it"


TRAINER_LOCKS = ["files/pyenv/requirements-gpu.lock.txt", "files/pyenv/requirements-lab.lock.txt"]


@pytest.mark.parametrize("lock", TRAINER_LOCKS)
def test_the_trainer_dependencies_are_locked_where_the_trainer_runs(lock: str) -> None:
    """The trainer wheel goes in after the lock (role pyenv: --no-deps; role trainer_run finds its
    dependencies installed): nothing it needs is left for an install without hashes."""
    entries = _read_lock(lock)
    for name, version in _pyproject_pins().items():
        # ==2.13.0 is met by 2.13.0+cpu: a pin without a local label ignores the candidate's (PEP 440,
        # "Version matching"); the lab's lock holds torch's CPU build
        assert name in entries and entries[name].version.split("+")[0] == version, (
            f"{lock}: the trainer needs {name}=={version} (pyproject.toml): add it to the input, bin/lock")


def test_the_sglang_lock_pins_the_role_versions() -> None:
    pins = _file_pins("files/sglang/requirements.txt")
    entries = _read_lock("files/sglang/requirements.lock.txt")
    for name, version in _sglang_defaults().items():
        assert pins.get(name) == version, f"files/sglang/requirements.txt: {name} is not the role's {version}"
        assert entries[name].version == version


def test_the_roles_default_to_the_locks() -> None:
    pyenv = yaml.safe_load((ROOT / "roles/pyenv/defaults/main.yml").read_text())
    sglang = yaml.safe_load((ROOT / "roles/sglang/defaults/main.yml").read_text())
    assert pyenv["pyenv_requirements_lock"].endswith("/../../files/pyenv/requirements-gpu.lock.txt")
    assert sglang["sglang_requirements_lock"].endswith("/../../files/sglang/requirements.lock.txt")
    lab = yaml.safe_load((ROOT / "inventory/lab/group_vars/gpu_containers.yml").read_text())
    assert lab["pyenv_requirements_lock"].endswith("/files/pyenv/requirements-lab.lock.txt")


def test_the_standin_lock_holds_the_standin_wheels_hashes(tmp_path: Path) -> None:
    """The tests' and the lab's SGLang lock: the stand-in wheels with their sha256, as the role requires."""
    v = _sglang_defaults()
    subprocess.run([sys.executable, str(STANDINS), str(tmp_path), "--sglang-version", v["sglang"],
                    "--router-version", v["sglang-router"], "--lock", str(tmp_path / "lock.txt")],
                   check=True, capture_output=True)
    text = (tmp_path / "lock.txt").read_text()
    for dist, wheel in (("sglang", "sglang"), ("sglang-router", "sglang_router")):
        digest = hashlib.sha256((tmp_path / f"{wheel}-{v[dist]}-py3-none-any.whl").read_bytes()).hexdigest()
        assert f"{dist}=={v[dist]} \\\n    --hash=sha256:{digest}\n" in text, text


def test_the_controller_lock_is_the_dev_constraints_and_torch_cpu() -> None:
    """requirements/controller.lock.txt holds what requirements/dev-constraints.txt pins and torch's CPU
    build, nothing else: a pin added, changed or dropped there without bin/lock fails here."""
    entries = {name: entry.version for name, entry in _read_lock(CONTROLLER_LOCK).items()}
    expected = {**_file_pins(DEV_CONSTRAINTS), **_torch("+cpu")}
    assert entries == expected, (
        f"{CONTROLLER_LOCK} differs from {DEV_CONSTRAINTS} + {TORCH_TXT} (+cpu): run bin/lock; "
        f"only in the lock: {sorted(entries.items() - expected.items())}, "
        f"only in the inputs: {sorted(expected.items() - entries.items())}")


def test_the_cpu_controller_lock_has_no_cuda() -> None:
    entries = _read_lock(CONTROLLER_LOCK)
    assert entries["torch"].version.endswith("+cpu")
    cuda = sorted(n for n in entries if n == "triton" or n.startswith(("nvidia-", "cuda-")))
    assert not cuda, f"{CONTROLLER_LOCK}: {cuda} (the CPU build of torch needs none of them)"


@pytest.mark.parametrize("lock", [CONTROLLER_LOCK, CONTROLLER_CUDA_LOCK])
def test_the_controller_lock_holds_everything_pyproject_names(lock: str) -> None:
    """bin/bootstrap installs the trainer with --no-deps after the lock: its dependencies and the dev
    extra's must all be in the lock, with hashes."""
    entries = _read_lock(lock)
    for name, version in _pyproject_dev_pins().items():
        assert name in entries, f"{lock}: {name} (pyproject.toml) is missing: run bin/lock"
        assert entries[name].version.split("+")[0] == version, (
            f"{lock}: {name}=={entries[name].version}, but pyproject.toml pins {version}: run bin/lock")
        assert entries[name].hashes


def test_bootstrap_installs_the_controller_locks_with_hashes() -> None:
    text = (ROOT / "bin/bootstrap").read_text()
    for lock in (CONTROLLER_LOCK, CONTROLLER_CUDA_LOCK, "requirements/pip.lock.txt"):
        assert lock in text, f"bin/bootstrap does not install {lock}"
    assert text.count("--require-hashes") >= 2, "bin/bootstrap installs pip and a lock with --require-hashes"
