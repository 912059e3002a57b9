"""Offline tau with greedy verification: the chain rule by hand, and `python -m trainer eval` on a
checkpoint trained here (tiny random Qwen3.5 target; the data is the target's own greedy continuation,
as regenerated data is, so the offline verify is exact)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml

from trainer.eval.acceptance import greedy_tau
from trainer.layout import RunLayout

REPO = Path(__file__).resolve().parents[2]


def test_greedy_tau_chain_by_hand() -> None:
    m = torch.tensor([[[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]]], dtype=torch.bool)
    agree = torch.tensor([[[1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]], dtype=torch.bool)
    keep = torch.tensor([[True, True, True, False]])
    # block 0: slots 1,2 match -> 3; block 1: slot 2 matches but data left the greedy path at slot 2,
    # so slot 3 cannot be verified on the data prefix -> 1 + 2 = 3; block 2: slot 1 wrong -> 1
    assert greedy_tau(m, agree, keep).tolist() == [3, 3, 1]


def _greedy_rows(target_dir: Path, n: int, length: int) -> list[tuple[list[int], list[int]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True).eval()
    rng = random.Random(0)
    prompts = torch.tensor([[rng.randrange(500) for _ in range(6)] for _ in range(n)])
    with torch.no_grad():  # one batched greedy generate: the data is the target's own continuation
        out = model.generate(prompts, max_new_tokens=length - 6, min_new_tokens=length - 6, do_sample=False)
    return [(ids, [0] * 6 + [1] * (len(ids) - 6)) for ids in out.tolist()]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.dflash.tiny import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("tiny") / "target")


@pytest.mark.slow
def test_eval_cli_reports_tau_of_a_trained_checkpoint(tmp_path: Path, tiny_target: Path, capsys) -> None:
    import sys

    sys.path.insert(0, str(REPO / "tests" / "dflash"))
    from dflash_factory import write_shards

    from trainer.cli import main
    from trainer.config import load_run_config
    from trainer.dflash.loop import train

    data = yaml.safe_load((REPO / "tests/fixtures/runs/overfit.yml").read_text())
    data["target"]["path"] = str(tiny_target)
    data["run_dir"] = str(tmp_path / "run")
    data["train"].update(max_steps=30)
    data["eval"] = {"max_samples": 4, "max_anchors": 16}
    write_shards(tmp_path / "run" / "shards", _greedy_rows(tiny_target, 4, 40))
    path = tmp_path / "overfit.yml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_run_config(path)
    res = train(cfg)

    assert main(["eval", str(path), "--checkpoint", str(res.checkpoint)]) == 0
    printed = capsys.readouterr().out
    assert "tau" in printed and "tau= 1" in printed
    out = json.loads((RunLayout.of(cfg).root / "eval" / "step-0000030.json").read_text())
    b = cfg.drafter.block_size
    assert sorted(int(k) for k in out["tau_histogram"]) == list(range(1, b + 1))
    assert sum(out["tau_histogram"].values()) == out["blocks"] > 0
    mean = sum(int(k) * v for k, v in out["tau_histogram"].items()) / out["blocks"]
    assert out["tau_mean"] == pytest.approx(mean)
    assert out["tau_mean"] >= b / 2  # memorised greedy data: the drafts verify
    assert out["split"] == "training" and "scored on TRAINING samples (in-sample" in printed
    # with a held-out split, eval scores the held-out shards by default and says so
    rows = _greedy_rows(tiny_target, 4, 40)
    write_shards(tmp_path / "run" / "shards-heldout", rows[:2])
    held = ["--set", "data.heldout_share=0.05"]
    assert main(["eval", str(path), "--checkpoint", str(res.checkpoint), *held]) == 0
    assert "scored on held-out samples (never trained on)" in capsys.readouterr().out
    out = json.loads((RunLayout.of(cfg).root / "eval" / "step-0000030.json").read_text())
    assert (out["split"], out["samples"]) == ("heldout", 2)
    assert out["shards"] == str(tmp_path / "run" / "shards-heldout")
    write_shards(tmp_path / "run" / "shards-heldout", [])  # a split that held out nothing: said, not 0
    assert main(["eval", str(path), "--checkpoint", str(res.checkpoint), *held]) == 2
    # stage(cfg) scores the latest checkpoint; a run without one fails with a clear message
    assert main(["eval", str(path), "--set", f"run_dir={tmp_path}/empty"]) == 2
