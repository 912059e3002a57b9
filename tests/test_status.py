"""`python -m trainer status`: how a run is going, from the files its stages write (fixtures written here,
no stage is run)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.cli import main
from trainer.config import load_run_config
from trainer.layout import RunLayout
from trainer.status import StatusError, format_status, run_status

RUN = """\
name: st
stages: [generate, prepare, train, eval]
run_dir: {run_dir}
target: {{path: /m}}
generate: {{prompts: /p.jsonl, endpoints: ['http://10.0.0.1:30000'], format: jsonl}}
"""


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, RunLayout]:
    cfg_path = tmp_path / "st.yml"
    cfg_path.write_text(RUN.format(run_dir=tmp_path / "runs" / "{name}"))
    layout = RunLayout.of(load_run_config(cfg_path))
    return cfg_path, layout


def status(cfg_path: Path, **kw) -> dict:
    return run_status(load_run_config(cfg_path), **kw)


def write_lines(path: Path, lines: list[dict], tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + tail)


def step_line(step: int, **extra) -> dict:
    return {"step": step, "total_steps": 200, "loss": 3.0, "tau": 1.5, "lr": 1e-4, "grad_norm": 0.5, **extra}


def checkpoint(layout: RunLayout, step: int, total: int = 200) -> Path:
    d = layout.checkpoints / f"step-{step:07d}"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"step": step, "total_steps": total, "epoch": 0}))
    (layout.checkpoints / "latest").write_text(d.name + "\n")
    return d


def test_a_run_that_has_not_started(run: tuple[Path, RunLayout], capsys: pytest.CaptureFixture) -> None:
    cfg_path, layout = run
    st = status(cfg_path)
    assert st["stage"] == "not started" and st["started"] is False
    assert {st[s]["state"] for s in ("generate", "prepare", "train", "eval")} == {"not started"}
    assert main(["status", str(cfg_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run st: not started: no stage has written anything yet")
    assert f"run dir   {layout.root}" in out


def test_generate_in_progress_from_its_progress_file(run: tuple[Path, RunLayout]) -> None:
    cfg_path, layout = run
    layout.generate_state.mkdir(parents=True)
    layout.generate_progress.write_text(json.dumps({
        "updated": 1000.0, "elapsed_s": 60.0, "done": 250, "total": 1000, "already_done": 100,
        "completed": 150, "rejected": 3, "completions_per_s": 2.5, "tokens_out_per_s": 1800.0, "eta_s": 298.8,
        "endpoints_up": 6, "endpoints": 7}))
    st = status(cfg_path, now=1012.0)
    assert st["stage"] == "generate"
    g = st["generate"]
    assert (g["state"], g["done"], g["total"], g["rejected"]) == ("in progress", 250, 1000, 3)
    assert g["eta_s"] == 298.8
    assert g["updated_s_ago"] == 12.0
    text = format_status(st)
    assert "1,000" in text and "250/1,000 conversations done (25.0%), 3 rejected (updated 12s ago)" in text
    assert "2.50 compl/s, 1,800 out tok/s, ETA 4m59s, endpoints up 6/7" in text
    assert "prepare   not started" in text and "train     not started" in text


def test_the_generate_writers_progress_file_is_what_status_reads(run: tuple[Path, RunLayout]) -> None:
    """The real writer: the spool's open shard and Progress's file, as a live generate leaves them."""
    from trainer.generate.progress import Progress
    from trainer.generate.store import ShardStore

    cfg_path, layout = run
    store = ShardStore(layout.generate_output, "jsonl", shard_records=100)
    try:
        for i in range(7):
            store.write({"id": f"p{i}", "messages": []})
        # before the progress file: the spool's own count, total unknown
        g = status(cfg_path)["generate"]
        assert (g["state"], g["done"], g["total"]) == ("in progress", 7, None)
        assert "7 conversations written (no progress file" in format_status(status(cfg_path))
        progress = Progress([], 10.0, layout.generate_progress)
        progress.start(40, already_done=7)
        for _ in range(5):
            progress.answered(100)
            progress.completed()
        progress.tick()
    finally:
        store.close()
    g = status(cfg_path)["generate"]
    assert (g["state"], g["done"], g["total"], g["rejected"]) == ("in progress", 12, 47, 0)
    # 35 of this run's 40 prompts left at the writer's rate
    assert g["completions_per_s"] > 0 and g["eta_s"] == pytest.approx(35 / g["completions_per_s"], abs=0.1)


def write_train_fixture(layout: RunLayout) -> None:
    """60 steps of 200. Steps 1-5 are from before the step counts were logged (loss, tau, lr, grad_norm
    only); steps 6-10 ran slowly (10 s) and fall outside the 50-step window; in the window (11-60) odd steps
    take 1.5 s with 4000 tokens and MFU 0.25, even steps 2.5 s with 6000 tokens and MFU 0.5. Every 10th
    line also has the trainer's own rates (999: status must not use them). The last line is half written."""
    lines = [{"step": s, "loss": 4.0, "tau": 1.0, "lr": 1e-4, "grad_norm": 1.0} for s in range(1, 6)]
    for s in range(6, 61):
        odd = s % 2 == 1
        slow = s <= 10
        line = step_line(s, samples=8, tokens=4000 if odd else 6000, supervised_tokens=1000,
                         step_time_s=10.0 if slow else (1.5 if odd else 2.5), mfu=0.25 if odd else 0.5,
                         eta_s=1.0, loss=2.0 + s / 100, tau=2.0 if odd else 3.0)
        if s % 10 == 0:
            line.update(samples_per_s=999.0, tokens_per_s=999.0, supervised_tokens_per_s=999.0, elapsed_s=1.0)
        lines.append(line)
    write_lines(layout.metrics, lines, tail='{"step": 61, "total_st')
    checkpoint(layout, 50)
    (layout.checkpoints / "step-0000060").mkdir()  # being written: no meta.json yet


def test_train_in_progress_computes_rates_mfu_and_eta_over_the_window(run: tuple[Path, RunLayout]) -> None:
    cfg_path, layout = run
    write_train_fixture(layout)
    layout.shards.mkdir(parents=True)
    (layout.shards / "manifest.json").write_text(json.dumps({
        "format": 1, "counts": {"records": 100, "samples": 120, "rows": 118, "tokens": 500000,
                                "supervised_tokens": 200000}, "doctor": {"passed": True, "reasons": []}}))
    layout.generate_output.mkdir(parents=True)
    layout.generate_manifest.write_text(json.dumps({"records": 100, "complete": True, "rejected": 2}))
    st = status(cfg_path)
    assert st["stage"] == "train"
    assert st["generate"]["state"] == "done" and st["generate"]["done"] == 100
    assert st["prepare"]["state"] == "done" and st["prepare"]["rows"] == 118
    t = st["train"]
    assert (t["state"], t["step"], t["total_steps"], t["window_steps"], t["logged_steps"]) == (
        "in progress", 60, 200, 50, 60)
    # window = steps 11..60: 25 x 1.5 s + 25 x 2.5 s = 100 s
    assert t["samples_per_s"] == 400 / 100 == 4.0
    assert t["tokens_per_s"] == (25 * 4000 + 25 * 6000) / 100 == 2500.0
    assert t["supervised_tokens_per_s"] == 50 * 1000 / 100 == 500.0
    assert t["step_time_s"] == 2.0
    assert t["mfu"] == (25 * 0.25 * 1.5 + 25 * 0.5 * 2.5) / 100 == 0.40625  # time-weighted
    assert t["eta_s"] == (200 - 60) * 2.0 == 280.0
    assert t["loss"] == 2.6 and t["tau"] == 3.0 and t["tau_mean"] == 2.5
    assert t["checkpoint"] == str(layout.checkpoints / "step-0000050") and t["checkpoint_step"] == 50
    assert st["eval"]["state"] == "not started"
    text = format_status(st)
    assert "run st: in stage train" in text
    assert "generate  done: 100 conversations, 2 rejected" in text
    assert ("prepare   done: 118 rows from 120 samples, 500,000 tokens (200,000 supervised), "
            "doctor passed") in text
    assert "step 60/200 (30.0%)" in text
    assert "loss 2.6000 (mean 2.3550), tau 3.000 (mean 2.500), lr 1.00e-04, grad norm 0.500" in text
    assert ("4.00 samples/s, 2,500 tokens/s (500 supervised tokens/s), 2.000 s/step, MFU 40.6%, ETA 4m40s "
            "(last 50 steps)") in text
    assert f"latest checkpoint: {layout.checkpoints / 'step-0000050'} (step 50)" in text
    # a smaller window: the last 10 steps only
    t = status(cfg_path, window=10)["train"]
    assert (t["window_steps"], t["samples_per_s"], t["eta_s"]) == (10, 80 / 20, 280.0)


def test_an_older_run_without_step_times_shows_what_it_has(run: tuple[Path, RunLayout]) -> None:
    cfg_path, layout = run
    write_lines(layout.metrics, [{"step": s, "loss": 1.0, "tau": 2.0, "lr": 1e-4, "grad_norm": 0.1}
                                 for s in range(1, 31)])
    checkpoint(layout, 30, total=120)
    t = status(cfg_path)["train"]
    assert (t["state"], t["step"], t["total_steps"]) == ("in progress", 30, 120)  # total from the checkpoint
    assert t["samples_per_s"] is None and t["mfu"] is None and t["eta_s"] is None
    text = format_status(status(cfg_path))
    assert "step 30/120 (25.0%)" in text and "throughput, MFU and ETA unknown" in text


def test_mfu_is_not_available_without_a_device_peak(run: tuple[Path, RunLayout]) -> None:
    cfg_path, layout = run
    write_lines(layout.metrics, [step_line(s, samples=4, tokens=100, supervised_tokens=50, step_time_s=1.0,
                                           mfu=None) for s in range(1, 4)])
    st = status(cfg_path)
    assert st["train"]["mfu"] is None and st["train"]["tokens_per_s"] == 100.0
    assert "MFU n/a (no device peak: train.placement.gpu_peak_tflops)" in format_status(st)


def test_a_finished_run_with_its_eval_result(run: tuple[Path, RunLayout]) -> None:
    cfg_path, layout = run
    layout.generate_state.mkdir(parents=True)
    layout.generate_manifest.write_text(json.dumps({"records": 48, "complete": True, "rejected": 0}))
    layout.generate_summary.write_text(json.dumps({"completions_per_s": 4.0, "tokens_out_per_s": 512.0,
                                                   "elapsed_s": 12.0}))
    layout.shards.mkdir(parents=True)
    (layout.shards / "manifest.json").write_text(json.dumps({"format": 1, "counts": {
        "rows": 48, "samples": 48, "tokens": 9000, "supervised_tokens": 4000}, "doctor": {"passed": True}}))
    write_lines(layout.metrics, [step_line(s, total_steps=12, samples=8, tokens=800, supervised_tokens=300,
                                           step_time_s=0.5, mfu=0.125) for s in range(1, 13)])
    checkpoint(layout, 12, total=12)
    layout.export.mkdir()
    (layout.export / "config.json").write_text("{}")
    layout.eval_dir.mkdir()
    for step, tau in ((6, 1.01), (12, 1.02)):
        layout.eval_result(step).write_text(json.dumps({"checkpoint": "c", "step": step, "samples": 8,
                                                        "blocks": 64, "tau_mean": tau}))
    st = status(cfg_path)
    assert st["stage"] == "finished"
    assert [st[s]["state"] for s in st["stages"]] == ["done"] * 4
    assert st["train"]["eta_s"] == 0.0 and st["train"]["samples_per_s"] == 16.0
    assert (st["eval"]["step"], st["eval"]["tau"]) == (12, 1.02)
    text = format_status(st)
    assert text.startswith("run st: finished: every stage is done")
    assert "generate  done: 48 conversations, 0 rejected; last run 4.00 compl/s, 512 out tok/s in 12s" in text
    assert "step 12/12 (100.0%), done" in text and "MFU 12.5%, ETA 0s" in text
    assert f"exported for SGLang: {layout.export}" in text
    assert f"eval      tau 1.020 at step 12 over 8 samples ({layout.eval_result(12)})" in text


def test_an_eval_of_an_older_checkpoint_is_not_the_runs_result(run: tuple[Path, RunLayout]) -> None:
    cfg_path, layout = run
    write_lines(layout.metrics, [step_line(s) for s in range(1, 21)])
    checkpoint(layout, 20)
    layout.eval_dir.mkdir()
    layout.eval_result(10).write_text(json.dumps({"step": 10, "tau_mean": 1.5, "samples": 8}))
    st = status(cfg_path)
    assert st["eval"]["state"] == "not started"
    assert "not run on the latest checkpoint yet; last result: tau 1.500 at step 10" in format_status(st)


def test_a_malformed_metrics_line_is_named(run: tuple[Path, RunLayout],
                                           capsys: pytest.CaptureFixture) -> None:
    """Line 3 is damaged (not the last line, which may be half written and is left out)."""
    cfg_path, layout = run
    write_lines(layout.metrics, [step_line(1), step_line(2)],
                tail="{oops\n" + json.dumps(step_line(4)) + "\n")
    with pytest.raises(StatusError, match=rf"{layout.metrics} line 3: not a JSON object"):
        status(cfg_path)
    assert main(["status", str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: run st: {layout.metrics} line 3: not a JSON object" in err
    write_lines(layout.metrics, [step_line(1), {"loss": 1.0}])
    with pytest.raises(StatusError, match=r"line 2: expected a JSON object with an integer \"step\""):
        status(cfg_path)


def test_cli_json_as_users_call_it(tmp_path: Path) -> None:
    """A relative run_dir, resolved against the working directory (the unit's), as --json."""
    cfg_path = tmp_path / "configs" / "st.yml"
    cfg_path.parent.mkdir()
    cfg_path.write_text(RUN.format(run_dir="runs/{name}"))
    over = tmp_path / "configs" / "st.overrides.yml"
    over.write_text("stages: [train]\n")
    metrics = tmp_path / "runs" / "st" / "metrics.jsonl"
    write_lines(metrics, [step_line(s, samples=2, tokens=64, supervised_tokens=32, step_time_s=0.25, mfu=0.1)
                          for s in range(1, 5)])
    r = subprocess.run([sys.executable, "-m", "trainer", "status", str(cfg_path), "--overrides", str(over),
                        "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["run_dir"] == str(tmp_path / "runs" / "st") and st["stages"] == ["train"]
    assert (st["stage"], st["train"]["step"], st["train"]["tokens_per_s"], st["train"]["eta_s"]) == (
        "train", 4, 256.0, 196 * 0.25)
    assert "generate" not in st


def test_each_node_of_a_multi_node_run_says_which_it_is(run: tuple[Path, RunLayout],
                                                        capsys: pytest.CaptureFixture) -> None:
    """Node 0 shows the job's figures and says so; another node (which ran no generate, prepare or eval and
    writes no metrics) says that node 0's status has them, instead of reporting stages it never runs."""
    cfg_path, layout = run
    write_lines(layout.metrics, [step_line(1), step_line(2)])
    multi = ["--set", "train.placement.nnodes=2", "--set", "train.placement.rdzv_endpoint=10.0.0.1:29500"]
    assert main(["status", str(cfg_path), *multi]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("(node 0 of 2: the job's figures)")
    assert "  train     step 2/200" in out
    assert main(["status", str(cfg_path), *multi, "--set", "train.placement.node_rank=1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run st: node 1 of 2: its ranks train in the job whose figures node 0's status")
    assert "  generate" not in out and "  train" not in out
