"""`python -m trainer check --json`: what the playbooks need, from the trainer, so they
need not restate its defaults."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.cli import main
from trainer.config import load_run_config
from trainer.report import run_report

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "myrun.yml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def check_json(capsys, *argv: str) -> dict:
    assert main(["check", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_defaults_of_a_minimal_run(tmp_path, capsys):
    run = write(tmp_path, "target:\n  path: /models/t\n")
    out = check_json(capsys, str(run), "--base-dir", "/srv/trainer")
    assert out["name"] == "myrun"
    assert out["stages"] == ["train"]
    assert out["run_dir"] == "/srv/trainer/runs/myrun"
    paths = out["paths"]
    assert paths["checkpoints"] == "/srv/trainer/runs/myrun/checkpoints"
    assert paths["eval_dir"] == "/srv/trainer/runs/myrun/eval"
    assert paths["eval_pattern"] == "step-*.json"
    assert paths["generate_output"] == "/srv/trainer/runs/myrun/generated"
    assert paths["generate_manifest"] == "/srv/trainer/runs/myrun/generated/manifest.json"
    assert out["generate"] == {"stage": False, "endpoints": [], "needs_endpoints": False,
                               "api_key_env": "SGLANG_API_KEY"}
    assert out["target"] == {"path": "/models/t", "stage_to": "", "source": "", "destination": ""}
    assert out["secret_env"] == {"s3": [], "wandb": [], "generate": []}
    assert out["secret_env_names"] == []
    assert out["placement"]["nnodes"] == 1 and out["placement"]["nproc_per_node"] == 1
    assert out["placement"]["launches_torchrun"] is False


def test_generate_run_with_s3_wandb_staging_and_placement(tmp_path, capsys):
    run = write(tmp_path, """
name: big
target: {path: /models/Qwen3.6-27B/, stage_to: /dev/shm/}
stages: [generate, prepare, train, eval]
run_dir: /data/{name}-dir
s3: {bucket: runs}
wandb: {project: dflash}
generate: {api_key_env: MY_KEY, output: gen}
data: {shards: /fast/shards}
train: {placement: {nnodes: 2, nproc_per_node: 8, rdzv_endpoint: "10.0.0.1:29500"}}
""", "big.yml")
    out = check_json(capsys, str(run), "--set", "train.placement.node_rank=1")
    assert out["name"] == "big"
    assert out["run_dir"] == "/data/big-dir"  # absolute: --base-dir does not apply
    assert out["paths"]["generate_output"] == "/data/big-dir/gen"
    assert out["paths"]["shards"] == "/fast/shards"
    assert out["paths"]["completions"] == "/data/big-dir/gen"
    assert out["generate"]["needs_endpoints"] is True
    assert out["target"]["source"] == "/models/Qwen3.6-27B"
    assert out["target"]["destination"] == "/dev/shm/big/Qwen3.6-27B"
    assert out["secret_env"]["generate"] == ["MY_KEY"]
    assert out["secret_env"]["wandb"] == ["WANDB_API_KEY"]
    assert "AWS_SECRET_ACCESS_KEY" in out["secret_env"]["s3"]
    assert "MY_KEY" in out["secret_env_names"]
    assert out["placement"] == {"nnodes": 2, "nproc_per_node": 8, "node_rank": 1, "world_size": 16,
                                "launches_torchrun": True, "rdzv_endpoint": "10.0.0.1:29500"}


def test_endpoints_given_by_an_overrides_file(tmp_path, capsys):
    run = write(tmp_path, "target: {path: /m}\nstages: [generate]\n")
    over = write(tmp_path, "generate:\n  endpoints: [http://10.0.0.5:30000]\n", "inv.yml")
    out = check_json(capsys, str(run), "--overrides", str(over))
    assert out["generate"]["endpoints"] == ["http://10.0.0.5:30000"]
    assert out["generate"]["needs_endpoints"] is False


def test_s3_inputs_without_a_bucket_still_need_s3_keys(tmp_path):
    run = write(tmp_path, "target: {path: /m}\nstages: [prepare]\ndata: {completions: 's3://b/c'}\n")
    assert run_report(load_run_config(run), run)["secret_env"]["s3"][:2] == [
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    offline = write(tmp_path, "target: {path: /m}\nwandb: {project: p, mode: offline}\n", "off.yml")
    report = run_report(load_run_config(offline), offline)
    assert report["secret_env"] == {"s3": [], "wandb": [], "generate": []}


def test_relative_run_dir_resolves_against_the_working_directory(tmp_path):
    run = write(tmp_path, "target: {path: /m}\n")
    r = subprocess.run([sys.executable, "-m", "trainer", "check", "--json", str(run)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # stdout is exactly one JSON object
    assert out["run_dir"] == str(tmp_path / "runs" / "myrun")


def test_a_refused_run_prints_no_json(tmp_path, capsys):
    run = write(tmp_path, "target: {path: /m}\ntrain: {lrr: 1}\n")
    assert main(["check", "--json", str(run)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unknown key train.lrr" in captured.err


@pytest.mark.parametrize("run", sorted((REPO / "files" / "runs").glob("*.yml")), ids=lambda p: p.stem)
def test_every_shipped_run_reports(run, capsys):
    out = check_json(capsys, str(run), "--base-dir", "/base")
    assert out["name"] == run.stem
    assert out["run_dir"].startswith("/")
    assert set(out["secret_env_names"]) == {n for v in out["secret_env"].values() for n in v}
