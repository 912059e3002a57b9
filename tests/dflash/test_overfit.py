"""Acceptance: on a handful of sequences the drafter's tau rises from ~1 to >= B/2 (B = 8 here) within a
few hundred steps, on CPU, with tests/fixtures/runs/overfit.yml and the real train loop (B's shards +
sampler)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.config import load_run_config
from trainer.dflash.loop import train
from trainer.layout import RunLayout


@pytest.mark.slow
def test_overfit_tau_rises_to_half_the_block(make_run) -> None:
    path = make_run("overfit")
    cfg = load_run_config(path)
    b = cfg.drafter.block_size
    res = train(cfg)
    lines = [json.loads(x) for x in (RunLayout.of(cfg).root / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, cfg.train.max_steps + 1))
    assert lines[0]["tau"] < 1.5, lines[0]  # an untrained drafter: ~1
    first_loss, last_loss = lines[0]["loss"], lines[-1]["loss"]
    assert last_loss < first_loss - 0.5, (first_loss, last_loss)
    assert res.last_log["tau"] >= b / 2, res.last_log
    assert len(res.last_log["slot_acc"]) == b - 1
    # the export SGLang loads is there, with the drafter's own weights only
    export = Path(res.export)
    conf = json.loads((export / "config.json").read_text())
    assert conf["architectures"] == ["DFlashDraftModel"] and conf["block_size"] == b
    assert (export / "model.safetensors").is_file()
