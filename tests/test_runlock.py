"""trainer/runlock.py: the lock of a run that does not exist yet makes its directory, and a command that
writes nothing there (refused, or read-only) leaves no directory behind; one that wrote keeps it."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer.cli import main
from trainer.runlock import hold


def test_a_refused_command_leaves_no_run_directory(tmp_path: Path) -> None:
    lock = tmp_path / "runs" / "new" / "run.lock"
    with pytest.raises(ValueError), hold(lock, "run new"):
        assert lock.is_file()
        raise ValueError("refused after the lock was taken")
    assert not (tmp_path / "runs").exists()


def test_a_command_that_wrote_keeps_its_directory(tmp_path: Path) -> None:
    lock = tmp_path / "runs" / "new" / "run.lock"
    with hold(lock, "run new"):
        (lock.parent / "metrics.jsonl").write_text("{}\n")
    assert (lock.parent / "metrics.jsonl").is_file()
    assert not lock.exists() or lock.read_text() == ""  # released: nobody named as the holder


def test_bad_arguments_to_train_make_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the tiny run's run_dir is relative: runs/tiny under the working directory
    tiny = str(Path(__file__).resolve().parents[1] / "files/runs/tiny.yml")
    assert main(["train", tiny, "--node-rank", "0"]) == 2
    assert list(tmp_path.iterdir()) == []
