"""Empty input is an error: a generate run with no usable prompt exits 2 with the count and the reasons
and leaves its output unmarked (no complete manifest), so that `run` does not go on to prepare."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from genhelpers import write_run

from trainer.cli import EXIT_BAD_INPUT, main

FAST = ("--reasoning-parser", "qwen3", "--latency", "0.02")


def complete(out: Path) -> bool:
    manifest = out / "manifest.json"
    return manifest.exists() and bool(json.loads(manifest.read_text()).get("complete"))


def test_an_empty_prompts_file_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "prompts.jsonl").write_text("\n\n")
    cfg = write_run(tmp_path, tmp_path / "prompts.jsonl", ["http://127.0.0.1:9"])
    assert main(["generate", str(cfg)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "generate.prompts" in err[0] and "no prompt" in err[0]
    assert not complete(tmp_path / "run" / "generated")


def test_run_stops_at_an_empty_generate_and_never_prepares(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "prompts.jsonl").write_text("")
    cfg = write_run(tmp_path, tmp_path / "prompts.jsonl", ["http://127.0.0.1:9"])
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert main(["run", str(cfg), "--set", "stages=[generate, prepare]"]) == EXIT_BAD_INPUT
    said = [r.getMessage() for r in caplog.records]
    assert any("stage generate" in m for m in said) and not any("stage prepare" in m for m in said)


def test_every_prompt_rejected_is_bad_input_with_counts_and_reasons(
        tmp_path: Path, sglang: Any, caplog: pytest.LogCaptureFixture) -> None:
    lines = ['{"id": "broken", "messages": [',
             json.dumps({"id": "nouser", "messages": [{"role": "system", "content": "s"}]}),
             '{"id": "broken2"',
             json.dumps({"id": "long", "messages": [{"role": "user", "content": "x" * 5000}]})]
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    cfg = write_run(tmp_path, tmp_path / "prompts.jsonl", [sglang(*FAST).url])
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert main(["generate", str(cfg)]) == EXIT_BAD_INPUT
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    line = errors[0]
    assert "no completion: 4 prompts rejected" in line
    assert "2 invalid JSON" in line and "prompts.jsonl:1" in line, line  # counted by reason, first ids shown
    assert not complete(tmp_path / "run" / "generated")


def test_some_rejects_are_summarised_on_the_console(tmp_path: Path, sglang: Any,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    good = json.dumps({"id": "ok", "messages": [{"role": "user", "content": "hello"}]})
    (tmp_path / "prompts.jsonl").write_text(good + "\n" + '{"id": "broken"\n')
    cfg = write_run(tmp_path, tmp_path / "prompts.jsonl", [sglang(*FAST).url])
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert main(["generate", str(cfg)]) == 0
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "1 prompts rejected (1 invalid JSON; first: prompts.jsonl:2)" in warned
    assert complete(tmp_path / "run" / "generated")
