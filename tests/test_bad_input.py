"""Bad input never surprises: each input a new user may try gives one line on stderr and the documented
exit code (0 ok, 1 the verdict is "no", 2 bad input, 130 interrupted, 70 a bug in the trainer)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer.cli import EXIT_BAD_INPUT, EXIT_BUG, EXIT_NO, main

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "files/runs/tiny.yml")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_plan_with_a_model_config_lacking_num_hidden_layers_is_bad_input_not_no_fit(tmp_path, capsys):
    model = tmp_path / "config.json"
    model.write_text(json.dumps({"hidden_size": 64, "vocab_size": 100}))
    assert main(["plan", TINY, "--model-config", str(model)]) == EXIT_BAD_INPUT
    line = one_line(capsys)
    assert str(model) in line and "num_hidden_layers" in line


def test_set_value_that_is_not_yaml(capsys):
    assert main(["check", TINY, "--set", "train.lr=[1"]) == EXIT_BAD_INPUT
    line = one_line(capsys)
    assert line.startswith("error: --set train.lr=[1: the value is not valid YAML") and "quote it" in line


def test_print_torchrun_with_a_node_rank_outside_the_placement(tmp_path, capsys):
    argv = ["train", TINY, "--set", f"run_dir={tmp_path}", "--print-torchrun", "--node-rank", "3"]
    assert main(argv) == EXIT_BAD_INPUT
    assert "--node-rank 3: train.placement.node_rank=3 is not in 0..0" in one_line(capsys)


def test_two_sections_of_the_same_name_are_refused_with_both_lines(tmp_path, capsys):
    run = tmp_path / "dup.yml"
    run.write_text("target: {path: /m}\ntrain:\n  placement: {nproc_per_node: 2}\ntrain:\n  lr: 1.0e-3\n")
    assert main(["check", str(run)]) == EXIT_BAD_INPUT
    line = one_line(capsys)
    assert f"{run}: line 4: duplicate key 'train' (first at line 2)" in line


def test_duplicate_nested_key_in_an_overrides_file(tmp_path, capsys):
    over = tmp_path / "over.yml"
    over.write_text("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n")
    assert main(["check", TINY, "--overrides", str(over)]) == EXIT_BAD_INPUT
    assert f"{over}: line 3: duplicate key 'lr' (first at line 2)" in one_line(capsys)


@pytest.mark.parametrize(("setting", "says"), [
    ("train.epochs=-1", "--set train.epochs=-1: train.epochs must be >= 1, got -1"),
    ("stages=[]", "--set stages=[]: stages: empty"),
    ("stages=[train, prepare]", "stages: ['train', 'prepare'] is not in pipeline order"),
    ('name=""', "name: '' is not a run name"),
    ("name=other", "name 'other' is not the file's name 'tiny'"),
    ("train.betas=[0.9, 2]", "train.betas must be within [0, 1), got (0.9, 2.0)"),
    ("train.lr=.nan", "train.lr: expected a finite number"),
    ("drafter.rms_norm_eps=0", "drafter.rms_norm_eps must be > 0"),
    ("s3.concurrency=0", "s3.concurrency must be >= 1"),
])
def test_out_of_range_values_are_refused(setting, says, capsys):
    assert main(["check", TINY, "--set", setting]) == EXIT_BAD_INPUT
    assert says in one_line(capsys)


def test_stages_out_of_order_in_the_run_file(tmp_path, capsys):
    run = tmp_path / "r.yml"
    run.write_text("target: {path: /m}\nstages: [train, prepare]\n")
    assert main(["check", str(run)]) == EXIT_BAD_INPUT
    assert one_line(capsys).startswith(f"error: {run}: stages:")


def test_negative_gpu_memory(capsys):
    assert main(["plan", TINY, "--gpu-memory-gb", "-5"]) == EXIT_BAD_INPUT
    assert "--gpu-memory-gb: must be a number > 0, got -5" in one_line(capsys)


def test_yaml_no_for_a_string_key_says_how_to_quote_it(capsys):
    assert main(["check", TINY, "--set", "wandb.project=no"]) == EXIT_BAD_INPUT
    line = one_line(capsys)
    assert "wandb.project: expected a string, got False" in line
    assert "YAML reads no as False" in line and "--set 'wandb.project=\"no\"'" in line
    assert main(["check", TINY, "--set", 'wandb.project="no"']) == 0


def test_set_errors_blame_the_set_and_overrides_errors_the_file(tmp_path, capsys):
    assert main(["check", TINY, "--set", "train.lr=-1"]) == EXIT_BAD_INPUT
    assert one_line(capsys).startswith("error: --set train.lr=-1: train.lr must be > 0")
    over = tmp_path / "over.yml"
    over.write_text("train: {keep_last: 0}\n")
    assert main(["check", TINY, "--overrides", str(over)]) == EXIT_BAD_INPUT
    assert one_line(capsys).startswith(f"error: {over}: train.keep_last must be >= 1")


def test_messages_name_the_key_once_and_the_value(capsys):
    assert main(["check", TINY, "--set", "train.grad_accum=0"]) == EXIT_BAD_INPUT
    line = one_line(capsys)
    assert "train: train." not in line and "train.grad_accum must be >= 1, got 0" in line
    assert main(["check", TINY, "--set", "generate.max_tokens=0"]) == EXIT_BAD_INPUT
    line = one_line(capsys)
    assert "generate: generate." not in line and "generate.max_tokens must be > 0" in line


def test_verbose_after_the_subcommand(capsys):
    assert main(["check", TINY, "-v"]) == 0
    assert main(["-v", "check", TINY]) == 0


def test_node_rank_without_print_torchrun_is_refused_before_any_run(capsys):
    assert main(["train", TINY, "--node-rank", "0"]) == EXIT_BAD_INPUT
    assert "--node-rank: only with --print-torchrun" in one_line(capsys)


def test_print_torchrun_of_a_one_process_run_is_refused(capsys):
    overfit = str(REPO / "tests/fixtures/runs/overfit.yml")
    assert main(["train", overfit, "--print-torchrun"]) == EXIT_BAD_INPUT
    assert "trains in one process" in one_line(capsys)


def test_base_dir_without_json_and_doctor_options_without_tokenizer_are_refused(tmp_path, capsys):
    assert main(["check", TINY, "--base-dir", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "--base-dir: only with --json" in one_line(capsys)
    assert main(["doctor", str(tmp_path), "--max-length", "128"]) == EXIT_BAD_INPUT
    assert "--max-length: only with --tokenizer" in one_line(capsys)


def test_the_launch_command_printed_is_the_one_the_stage_runs(tmp_path, capsys, monkeypatch):
    """--set and --overrides are in the resolved config both name; one function builds both."""
    import trainer.dflash.launch as launch

    over = tmp_path / "over.yml"
    over.write_text("train: {lr: 2.0e-4}\n")
    argv = ["train", TINY, "--overrides", str(over), "--set", f"run_dir={tmp_path / 'run'}",
            "--set", "train.placement.nproc_per_node=3"]
    assert main([*argv, "--print-torchrun"]) == 0
    printed = capsys.readouterr().out.strip()
    ran: list[list[str]] = []

    class Proc:
        stdout: Any = iter(())

        def __init__(self, cmd: list[str], **_kw: Any) -> None:
            ran.append(cmd)

        def wait(self) -> int:
            return 0

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", Proc)
    assert main(argv) == 0
    assert ran and " ".join(ran[0]) == printed
    resolved = (tmp_path / "run" / "launch" / "config.yml").read_text()
    assert "lr: 0.0002" in resolved and "nproc_per_node: 3" in resolved


def test_refused_data_is_the_same_no_from_train_as_from_doctor_and_prepare(tmp_path, capsys, monkeypatch):
    import trainer.dflash.loop as loop
    from trainer.data.shards import DataRefused

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise DataRefused("shards: the doctor refused this data")

    monkeypatch.setattr(loop, "train", refuse)
    run = tmp_path / "r.yml"
    run.write_text(f"target: {{path: /m}}\nrun_dir: {tmp_path}\n")
    assert main(["train", str(run)]) == EXIT_NO


def test_truncated_share_refusal_names_its_own_option() -> None:
    from trainer.data.config import DoctorConfig
    from trainer.data.doctor import SAMPLE_COLUMNS, diagnose, refused_flags

    n = 10
    cols: dict[str, list[Any]] = {c: [0] * n for c in SAMPLE_COLUMNS}
    cols.update(id=[f"s{i}" for i in range(n)], n_supervised=[100 + i for i in range(n)],
                longest_run=[100] * n, answer_chars=[50] * n, finish_reason=["stop"] * n,
                unterminated_think=[False] * n, gen_truncated=[False] * n, truncated=[True] * 5 + [False] * 5,
                response_hash=[f"h{i}" for i in range(n)], kept=[True] * n, length=[512] * n)
    verdict = diagnose(cols, DoctorConfig())
    assert not verdict.passed
    assert refused_flags(verdict.reasons) == ["--max-truncated-share"]


def test_an_unexpected_error_is_one_line_that_says_bug_and_the_traceback_is_under_v(capsys, monkeypatch):
    import trainer.report

    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("something inside broke")

    monkeypatch.setattr(trainer.report, "run_report", boom)
    assert main(["check", TINY, "--json"]) == EXIT_BUG
    line = one_line(capsys)
    assert "unexpected RuntimeError: something inside broke; this is a bug" in line and "-v" in line
    assert main(["check", TINY, "--json", "-v"]) == EXIT_BUG
    assert "Traceback" in capsys.readouterr().err


def test_help_documents_the_exit_codes() -> None:
    out = subprocess.run([sys.executable, "-m", "trainer", "--help"], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert "exit codes:" in out and "bad input" in out and "130" in out
    sub = subprocess.run([sys.executable, "-m", "trainer", "plan", "--help"], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert "exit codes:" in sub
