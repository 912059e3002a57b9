"""action=status runs `python -m trainer status` as root's play in the run's working directory, which the
run's user owns. `python -m` puts the working directory first on sys.path, so a `trainer/__main__.py`
planted there would run instead of the venv's trainer. The role's command line, rendered from
roles/trainer_run/tasks/status.yml, must import the installed trainer only, and run as the run's user."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[2]
STATUS = ROOT / "roles" / "trainer_run" / "tasks" / "status.yml"


def _status_argv(venv: Path, config: Path) -> list[str]:
    tasks = yaml.safe_load(STATUS.read_text())
    task = next(t for t in tasks if "python -m trainer status" in t["name"])
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    values = {"trainer_run_user": "trainer", "trainer_run_venv": str(venv),
              "_trainer_run_config": str(config),
              "_trainer_run_overrides_file": str(config.with_suffix(".overrides.yml"))}
    return [env.from_string(str(a)).render(values) for a in task["ansible.builtin.command"]["argv"]]


def test_status_runs_as_the_run_user_and_never_imports_from_its_working_directory(tmp_path: Path) -> None:
    venv = Path(sys.prefix)
    config = tmp_path / "configs" / "tiny.yml"
    argv = _status_argv(venv, config)
    assert argv[:4] == ["runuser", "-u", "trainer", "--"]  # the run's user, never root
    planted = tmp_path / "base" / "trainer"
    planted.mkdir(parents=True)
    (planted / "__main__.py").write_text("import os\nprint('PLANTED as uid', os.getuid())\n")
    # The interpreter of this test venv may live where another user cannot execute it (e.g. under /root),
    # so the command runs here without its runuser prefix: what is checked is the import path, which the
    # interpreter's flags alone decide.
    r = subprocess.run(argv[4:], cwd=planted.parent, capture_output=True, text=True, check=False)
    assert "PLANTED" not in r.stdout + r.stderr
    assert str(config) in r.stdout + r.stderr  # the venv's trainer ran and named the missing run file
    # Without -I the same command would have run the planted module: the test can fail.
    bare = [a for a in argv[4:] if a != "-I"]
    r2 = subprocess.run(bare, cwd=planted.parent, capture_output=True, text=True, check=False)
    assert "PLANTED" in r2.stdout
