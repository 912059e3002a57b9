"""A new user's first hour, through the real command line: the commands that could damage a run or that
used to end in exit 70 ("a bug in the trainer") for the user's own environment or input.

Each case runs `python -m trainer ...` in a subprocess and checks the one line it prints and its exit
code: 2 for input (and an environment that cannot run the run), 1 for a verdict (the run is in use),
0 where there is nothing wrong. Nothing a refused command touches may change. Run with `-s` to see the
table (case | line | exit code).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPLETIONS = REPO / "trainer/quickstart_data/completions.jsonl"


def trainer(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def one_line(p: subprocess.CompletedProcess[str], case: str) -> str:
    """The command's one error line (stderr), printed as a row of the trial's table."""
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, f"{case}: expected one error line, got:\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stderr and "bug in the trainer" not in p.stderr, p.stderr[-3000:]
    print(f"\nTRIAL | {case} | {errors[0]} | {p.returncode}")
    return errors[0]


def write_run(tmp: Path, name: str = "trial", **sections: dict[str, Any]) -> Path:
    """A small run file: the quickstart's bundled completions, a target dir under tmp (absent unless a
    case makes it), a CPU train of one process."""
    data: dict[str, Any] = {
        "name": name, "stages": ["prepare", "train", "eval"], "run_dir": str(tmp / "run"),
        "target": {"path": str(tmp / "model"), "dtype": "float32"},
        "data": {"completions": str(COMPLETIONS), "max_length": 256, "num_workers": 1, "heldout_share": 0.2},
        "train": {"device": "cpu", "max_steps": 4, "placement": {"strategy": "none"}, "progress": False},
    }
    for key, val in sections.items():
        data[key] = {**data.get(key, {}), **val}
    path = tmp / f"{name}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def finished_run(run_dir: Path) -> dict[str, bytes]:
    """The files a finished train leaves (a complete checkpoint named by `latest`, metrics, an export),
    as {relative path: bytes}."""
    ckpt = run_dir / "checkpoints" / "step-0000004"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 4}))
    (run_dir / "checkpoints" / "latest").write_text("step-0000004\n")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n"
                                                   for s in range(1, 5)))
    (run_dir / "export").mkdir()
    (run_dir / "export" / "model.safetensors").write_bytes(b"weights")
    return snapshot(run_dir)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


# -------------------------------------------------------------------------------------- one writer
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trainer.runlock import hold
    with hold(Path(sys.argv[1]), "run trial"):
        print("held", flush=True)
        time.sleep(60)
""")


@pytest.mark.parametrize("command", ["train", "prepare", "generate", "run"])
def test_a_second_writer_on_the_same_run_is_refused_naming_the_holder(tmp_path: Path, command: str) -> None:
    run_file = write_run(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run" / "run.lock")], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        p = trainer(command, str(run_file))
    finally:
        holder.kill()
        holder.wait()
    line = one_line(p, f"second {command} while another command holds the run")
    assert p.returncode == 1
    assert f"in use by pid {holder.pid} on host " in line and "run.lock" in line
    assert sorted(q.name for q in (tmp_path / "run").iterdir()) == ["run.lock"]  # nothing written


def test_the_lock_is_released_when_its_holder_ends(tmp_path: Path) -> None:
    """flock(2): a holder killed without cleanup leaves no lock behind."""
    lock = tmp_path / "run" / "run.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait()
    from trainer.runlock import hold

    with hold(lock, "run trial"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with hold(lock, "run trial"):  # nested in one process (run -> its stages): no self-conflict
            pass
    assert lock.read_text() == ""


# ------------------------------------------------------------------------------- train over a run
def test_train_over_a_finished_run_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    run_file = write_run(tmp_path)
    before = finished_run(tmp_path / "run")
    p = trainer("train", str(run_file), "--set", "train.lr=1e-4")
    line = one_line(p, "train over a finished run (no --resume/--fresh)")
    assert p.returncode == 2
    assert "checkpoint step-0000004" in line and "--resume" in line and "--fresh" in line
    assert snapshot(tmp_path / "run") == before


def test_fresh_moves_the_earlier_run_aside_and_deletes_nothing(tmp_path: Path) -> None:
    from trainer.config import load_run_config
    from trainer.dflash.stage import refuse_restart, set_aside

    cfg = load_run_config(write_run(tmp_path))
    before = finished_run(tmp_path / "run")
    dest = set_aside(cfg)
    assert dest is not None and dest.parent == tmp_path / "run" / "set-aside"
    assert snapshot(dest) == before
    refuse_restart(cfg)  # nothing left to write over
    assert set_aside(cfg) is None


def test_keep_last_never_removes_what_latest_names(tmp_path: Path) -> None:
    """A restart at step 0 beside a later step dir of an earlier run: the new checkpoint stays."""
    from trainer.dflash.checkpoint import prune_checkpoints
    from trainer.layout import latest_checkpoint

    root = tmp_path / "checkpoints"
    for step in (2, 24):
        (root / f"step-{step:07d}").mkdir(parents=True)
        (root / f"step-{step:07d}" / "meta.json").write_text("{}")
    (root / "latest").write_text("step-0000002\n")
    assert prune_checkpoints(root, 1, root / "step-0000002") == []
    assert latest_checkpoint(root) == root / "step-0000002"
    (root / "step-0000004").mkdir()
    (root / "latest").write_text("step-0000004\n")
    assert prune_checkpoints(root, 1, root / "step-0000004") == [root / "step-0000002"]


# ------------------------------------------------------------------------------------- quickstart
def test_quickstart_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("my notes")
    p = trainer("quickstart", str(tmp_path))
    line = one_line(p, "quickstart into a non-empty directory")
    assert p.returncode == 2 and "not empty" in line
    assert (tmp_path / "run" / "notes.txt").read_text() == "my notes"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["run"]


def test_quickstart_never_reuses_a_half_built_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.dflash.tiny as tiny
    from trainer import quickstart

    built: list[Path] = []

    def fake_build(out: Path, **_: Any) -> Path:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        built.append(out)
        return out

    monkeypatch.setattr(tiny, "build_tiny_target", fake_build)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a build stopped half way: no completion mark
    quickstart._build_model(model)
    assert len(built) == 1 and built[0] != model and (model / quickstart.MODEL_DONE).is_file()
    quickstart._build_model(model)  # complete now: reused
    assert len(built) == 1 and not list(tmp_path.glob(".model.tmp-*"))


# ----------------------------------------------------------------------- exit 70 for the user's own
@pytest.mark.slow  # torch imported in the command (the device check)
def test_a_cuda_run_without_a_device_is_refused_once_before_torchrun(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    run_file = write_run(tmp_path, train={"device": "cuda", "placement": {"nproc_per_node": 8}})
    p = trainer("train", str(run_file))
    line = one_line(p, "cuda run (8 ranks) on a machine without CUDA")
    assert p.returncode == 2 and "no usable CUDA device" in line and "train.device=cpu" in line
    assert "torch.distributed" not in p.stderr and not (tmp_path / "run" / "launch").exists()


def test_a_target_config_json_that_is_a_list_is_bad_input(tmp_path: Path) -> None:
    run_file = write_run(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("[1, 2]")
    for argv, case in ((("train", str(run_file)), "train: target config.json is a list"),
                       (("plan", str(run_file)), "plan: target config.json is a list"),
                       (("eval", str(run_file)), "eval: target config.json is a list")):
        p = trainer(*argv)
        line = one_line(p, case)
        assert p.returncode == 2 and "config.json" in line and "list" in line


def test_a_corrupt_metrics_file_on_resume_is_refused_with_its_line(tmp_path: Path) -> None:
    run_file = write_run(tmp_path)
    finished_run(tmp_path / "run")
    with (tmp_path / "run" / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 5, "lo\n')
    before = snapshot(tmp_path / "run")
    p = trainer("train", str(run_file), "--resume")
    line = one_line(p, "train --resume with a corrupt metrics.jsonl")
    assert p.returncode == 2 and "metrics.jsonl:5:" in line
    assert snapshot(tmp_path / "run") == before


def test_a_missing_dependency_is_named(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "transformers.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'transformers'\", name='transformers')\n")
    p = trainer("make-tiny-target", str(tmp_path / "tiny"), env={"PYTHONPATH": str(shadow)})
    line = one_line(p, "a missing dependency (transformers)")
    assert p.returncode == 2 and "'transformers'" in line and "pip install" in line


def test_status_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    run_file = write_run(tmp_path)
    finished_run(tmp_path / "run")
    p = subprocess.Popen([sys.executable, "-m", "trainer", "status", str(run_file), "--json"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the command writes (`status | head -0`)
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0 and err == ""
    print(f"\nTRIAL | status | head (closed pipe) | (nothing) | {p.returncode}")


# ----------------------------------------------------------------------------------- input edges
@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.data.tiny_tokenizer import build_tiny_tokenizer

    out = tmp_path_factory.mktemp("tok")
    build_tiny_tokenizer(out)
    return out


@pytest.mark.slow  # a tokenizer built, transformers imported in the command
def test_a_line_over_max_line_bytes_is_refused_with_its_line_number(tmp_path: Path, tokenizer_dir: Path,
                                                                    ) -> None:
    lines = COMPLETIONS.read_text().splitlines()
    big = json.loads(lines[0])
    big["messages"][0]["content"] = "x" * 5000
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join([lines[1], json.dumps(big), *lines[2:]]) + "\n")
    run_file = write_run(tmp_path, data={"completions": str(data), "tokenizer": str(tokenizer_dir),
                                         "max_line_bytes": 4096})
    p = trainer("prepare", str(run_file))
    line = one_line(p, "prepare: a line over data.max_line_bytes")
    assert p.returncode == 2 and f"{data}:2:" in line and "data.max_line_bytes" in line
    assert not (tmp_path / "run" / "shards").exists()


@pytest.mark.slow  # a tokenizer built, transformers imported in the command
def test_prepare_with_no_sample_left_is_one_refusal(tmp_path: Path, tokenizer_dir: Path) -> None:
    from trainer.data.split import is_heldout, split_key

    data = tmp_path / "in.jsonl"
    recs = [json.loads(line) for line in COMPLETIONS.read_text().splitlines()]
    held = [r for r in recs if is_heldout(split_key(r["messages"], r.get("id", "")), 0.5)]
    assert held
    data.write_text(json.dumps(held[0]) + "\n")
    run_file = write_run(tmp_path, data={"completions": str(data), "tokenizer": str(tokenizer_dir),
                                         "heldout_share": 0.5})
    p = trainer("prepare", str(run_file))
    line = one_line(p, "prepare: no sample left for training")
    assert p.returncode == 2 and "no sample left" in line
    assert "PASSED" not in p.stdout and "REFUSED" not in p.stdout + p.stderr
    assert not (tmp_path / "run" / "shards").exists()


def test_a_nested_unknown_set_key_is_blamed_on_set(tmp_path: Path) -> None:
    run_file = write_run(tmp_path)
    p = trainer("check", str(run_file), "--set", "drafter.bogus.x=1")
    line = one_line(p, "--set drafter.bogus.x=1")
    assert p.returncode == 2 and line.startswith("error: --set drafter.bogus.x=1: unknown key drafter.bogus")


def test_plan_on_a_generate_only_run_says_what_it_needs(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "files/runs/qwen36-27b-regen.yml").read_text())
    run_file = tmp_path / "qwen36-27b-regen.yml"
    run_file.write_text(yaml.safe_dump({**data, "run_dir": str(tmp_path / "run")}))
    p = trainer("plan", str(run_file))
    assert p.returncode == 0 and "does not fit" not in p.stdout + p.stderr
    assert "has no train stage" in p.stdout and "generate.endpoints" in p.stdout
    print(f"\nTRIAL | plan on a generate-only run | {p.stdout.strip()} | {p.returncode}")


def test_each_node_of_a_multi_node_run_holds_its_own_lock(tmp_path: Path) -> None:
    """A run dir on shared storage takes one launcher per node: node 1 is not refused while node 0
    holds the run; a second command for node 0 is."""
    run_file = write_run(tmp_path, train={"placement": {"nnodes": 2, "rdzv_endpoint": "127.0.0.1:29400"}})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run" / "run.lock")], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        node1 = trainer("train", str(run_file), "--print-torchrun", "--set", "train.placement.node_rank=1")
        node0 = trainer("train", str(run_file), "--print-torchrun")
    finally:
        holder.kill()
        holder.wait()
    assert node1.returncode == 0 and "--node-rank=1" in node1.stdout, node1.stderr
    assert node0.returncode == 1 and f"in use by pid {holder.pid}" in node0.stderr
    assert (tmp_path / "run" / "run.node-1.lock").is_file()
