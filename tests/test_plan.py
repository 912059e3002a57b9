"""`python -m trainer plan RUN.yml`: per-GPU memory and FLOPs from config.json alone (the real Qwen3.6-27B
values in tests/fixtures/qwen36-27b/config.json), exit 1 with the numbers when a placement cannot fit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import load_run_config
from trainer.dflash.plan import build_plan, read_model_config, target_params

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests/fixtures/qwen36-27b/config.json"
RUN = REPO / "files/runs/qwen36-27b-dflash.yml"


def plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer", "plan", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_qwen36_27b_parameter_counts() -> None:
    t = read_model_config(FIXTURE)
    # 64 layers (48 gated-DeltaNet + 16 gated attention), untied 248320 x 5120 embeddings: ~26.9B,
    # 53.8 GB in bf16 (~55.6 GB with the vision tower, which the trainer never loads)
    assert target_params(t) == pytest.approx(26.9e9, rel=0.005)
    p = build_plan(load_run_config(RUN), t, 96)
    assert p.drafter_params == pytest.approx(1.73e9, rel=0.005)  # SpecForge's ~1.7B drafter
    gpu = p.gpus[0]
    # fsdp over 8 ranks: 16 bytes of fp32 state per parameter / 8, the bf16 weights gathered for compute,
    # one decoder layer's unsharded gradient (bf16 + its fp32 reduce copy); no embedding copy (colocated)
    layer = (p.drafter_params - 5 * 5120 * 5120) // 5
    assert gpu.drafter_state == pytest.approx(p.drafter_params * (16 / 8 + 2) + layer * 6)
    ddp = build_plan(load_run_config(RUN, ["train.placement.strategy=ddp"]), t, 96)
    assert ddp.gpus[0].drafter_state == pytest.approx(p.drafter_params * 16)  # a full replica per rank


def test_the_27b_run_prints_a_table_per_gpu_and_fits_8_colocated_ranks_on_96gb() -> None:
    r = plan(str(RUN), "--model-config", str(FIXTURE))
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert [row[0] for row in rows] == [str(i) for i in range(8)]  # one row per GPU of the placement
    assert [row[1] for row in rows] == [f"d{i},t{i}" for i in range(8)]  # target and drafter together
    assert all(row[-1] == "yes" and float(row[-3]) <= 96 for row in rows)
    assert float(rows[0][2]) == pytest.approx(53.8, abs=0.1)  # target weights, GB
    assert float(rows[0][4]) == pytest.approx(8.8, abs=0.1)  # sharded drafter state + gathered bf16 weights
    assert "TFLOP" in r.stdout and "strategy fsdp over 8 rank(s)" in r.stdout
    j = json.loads(plan(str(RUN), "--model-config", str(FIXTURE), "--json").stdout)
    assert j["fits"] and len(j["gpus"]) == 8 and j["tokens_per_step"] == 8 * 4096
    # the same placement with a full drafter replica per rank does not fit a 96 GB card
    full = plan(str(RUN), "--model-config", str(FIXTURE), "--set", "train.placement.strategy=ddp")
    assert full.returncode == 1 and "needs 104.1 GB" in full.stderr
    assert "Shard the drafter's state over the ranks (train.placement.strategy: fsdp)" in full.stderr


def test_target_and_drafter_on_one_48gb_card_is_refused_with_the_numbers() -> None:
    r = plan(str(RUN), "--model-config", str(FIXTURE), "--gpu-memory-gb", "48",
             "--set", "train.placement.nproc_per_node=1", "--set", "train.placement.target_gpus=[]",
             "--set", "train.placement.drafter_gpus=[]")
    assert r.returncode == 1
    assert "error: run qwen36-27b-dflash does not fit: GPU 0 needs 104.1 GB" in r.stderr
    assert "target weights 53.8" in r.stderr and "drafter + AdamW 27.7" in r.stderr and "of 48 GB" in r.stderr
    # colocated on 141 GB H200s: fits
    ok = plan(str(RUN), "--model-config", str(FIXTURE), "--set", "train.placement.nproc_per_node=8",
              "--set", "train.placement.target_gpus=[]", "--set", "train.placement.drafter_gpus=[]",
              "--set", "train.placement.gpu_memory_gb=141")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count(" yes") == 8


def test_smaller_activations_when_the_run_asks_for_less() -> None:
    t = read_model_config(FIXTURE)
    big = build_plan(load_run_config(RUN), t, 96).gpus[4]
    less = load_run_config(RUN, ["data.max_length=2048", "drafter.max_anchors=128"])
    small = build_plan(less, t, 96).gpus[4]
    assert small.drafter_activations < big.drafter_activations / 3
    assert small.drafter_state == big.drafter_state


def test_model_config_defaults_to_the_target_path_and_errors_clearly(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(FIXTURE.read_text())
    r = plan(str(RUN), "--set", f"target.path={model}")
    assert r.returncode == 0, r.stderr
    missing = plan(str(RUN), "--set", f"target.path={tmp_path / 'nope'}")
    assert missing.returncode == 2
    assert "cannot read the model's config.json" in missing.stderr and "Traceback" not in missing.stderr


def test_plan_needs_no_torch() -> None:
    """The controller that runs `plan` before deploying may have no torch / transformers."""
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from trainer.cli import main\n"
            f"sys.exit(main(['plan', {str(RUN)!r}, '--model-config', {str(FIXTURE)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TFLOP" in r.stdout


def test_flops_per_step_are_the_meters_count_of_a_full_length_sample() -> None:
    from trainer.dflash.arch import default_layer_ids, resolve_arch
    from trainer.dflash.plan import FlopCounter

    t = read_model_config(FIXTURE)
    cfg = load_run_config(RUN)
    arch = resolve_arch(cfg.drafter, t, default_layer_ids(64, 5), int(t.vocab_size))
    counter = FlopCounter.of(cfg, t, arch)
    p = build_plan(cfg, t, 96)
    assert p.flops_per_step == pytest.approx(8 * counter.micro([4096], [512]))  # the train log's MFU count
    # the target's forward dominates: 2 x its non-embedding parameters per token
    assert counter.target_per_token == 2 * (target_params(t) - 2 * 248320 * 5120)
    short = counter.micro([1024], [128])
    assert short < counter.micro([4096], [512]) / 3.9  # scales with the real tokens, not the padded shape
