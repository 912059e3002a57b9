"""`python -m trainer run` skips a prepare whose shards are complete, made from the same completions,
tokenizer and settings, and passed by the doctor; `--force` redoes it; new shards are swapped in whole."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from data_factory import healthy, write_jsonl

from trainer.cli import main
from trainer.data.shards import ShardDataset, check_doctor


@pytest.fixture
def run(tmp_path: Path, tiny_tok_dir: Path) -> Path:
    write_jsonl(tmp_path / "run" / "generated" / "part-00000-ab.jsonl", [healthy(i) for i in range(50)])
    path = tmp_path / "t.yml"
    path.write_text(yaml.safe_dump({
        "name": "t", "run_dir": str(tmp_path / "run"), "target": {"path": str(tiny_tok_dir)},
        "stages": ["prepare"], "data": {"num_workers": 1, "max_length": 1024, "heldout_share": 0.2}}))
    return path


def stamps(tmp_path: Path) -> dict[str, int]:
    """mtime_ns of every file under the shards dirs: unchanged when prepare was skipped."""
    files = [*(tmp_path / "run" / "shards").iterdir(), *(tmp_path / "run" / "shards-heldout").iterdir()]
    return {f"{f.parent.name}/{f.name}": f.stat().st_mtime_ns for f in files}


def run_logs(argv: list[str], caplog: Any) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert main(argv) == 0
    return caplog.text


def test_a_restart_skips_a_finished_prepare_and_force_redoes_it(tmp_path: Path, run: Path,
                                                                caplog: Any) -> None:
    assert "stage prepare skipped" not in run_logs(["run", str(run)], caplog)
    before = stamps(tmp_path)
    text = run_logs(["run", str(run)], caplog)
    assert "run t: stage prepare skipped: the shards at" in text and "--force redoes it" in text
    assert stamps(tmp_path) == before  # not a file touched
    text = run_logs(["run", str(run), "--force"], caplog)
    assert "skipped" not in text and "run t: stage prepare" in text
    after = stamps(tmp_path)
    assert after.keys() == before.keys() and all(after[k] != before[k] for k in before)
    assert not list((tmp_path / "run").glob(".*"))  # no staging dir left beside the shards


@pytest.mark.parametrize("change", ["completions", "setting", "doctor", "shard"])
def test_prepare_runs_again_when_its_inputs_or_outputs_changed(tmp_path: Path, run: Path, caplog: Any,
                                                               change: str) -> None:
    run_logs(["run", str(run)], caplog)
    argv = ["run", str(run)]
    if change == "completions":  # generate wrote another shard
        more = [healthy(i) for i in range(50, 60)]
        write_jsonl(tmp_path / "run" / "generated" / "part-00001-cd.jsonl", more)
    elif change == "setting":
        argv += ["--set", "data.max_length=512"]
    elif change == "doctor":
        argv += ["--set", "data.doctor.max_duplicate_share=0.3"]
    else:  # a shard lost or cut short
        next((tmp_path / "run" / "shards").glob("shard-*.arrow")).write_bytes(b"cut")
    assert "stage prepare skipped" not in run_logs(argv, caplog)
    check_doctor(tmp_path / "run" / "shards")
    if change == "completions":
        rows = [len(ShardDataset.open(tmp_path / "run" / d)) for d in ("shards", "shards-heldout")]
        assert sum(rows) == 60


def test_a_failed_prepare_leaves_the_old_shards_in_place(tmp_path: Path, run: Path, caplog: Any) -> None:
    run_logs(["run", str(run)], caplog)
    shards = tmp_path / "run" / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    before = stamps(tmp_path)
    (tmp_path / "run" / "generated" / "part-00002-ef.jsonl").write_text('{"id": "torn", "mess\n')
    assert main(["run", str(run)]) == 2  # the bad record is reported ...
    assert stamps(tmp_path) == before  # ... and the shards the doctor passed are still there, whole
    assert json.loads((shards / "manifest.json").read_text()) == manifest
    assert len(ShardDataset.open(shards, verify=True)) == manifest["counts"]["rows"]
    assert not list((tmp_path / "run").glob(".*"))
