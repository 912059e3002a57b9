"""Each component's cli.py parses arguments; its stage body lives in <component>/stage.py."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from trainer.cli import COMPONENTS, STAGES, main

ROOT = Path(__file__).resolve().parents[1] / "trainer"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_the_cli_calls_the_stage_module(name):
    cli = importlib.import_module(COMPONENTS[name])
    stage = importlib.import_module(STAGES[name])
    assert cli.stage is stage.stage
    assert stage.stage.__module__ == STAGES[name]


@pytest.mark.parametrize("component", ["generate", "data", "dflash", "eval"])
def test_cli_modules_define_only_argument_handling(component):
    tree = ast.parse((ROOT / component / "cli.py").read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert "register" in functions
    allowed = ("register", "_cmd", "_doctor_config")
    assert all(f.startswith(allowed) for f in functions), functions


def test_run_runs_the_stage_modules_in_order(tmp_path, monkeypatch):
    calls = []
    for name, module in STAGES.items():
        mod = importlib.import_module(module)
        monkeypatch.setattr(mod, "stage", lambda cfg, _n=name: calls.append((_n, cfg.seed)) or 0)
    run = tmp_path / "r.yml"
    run.write_text("target: {path: /m}\nstages: [generate, prepare, train, eval]\n")
    over = tmp_path / "o.yml"
    over.write_text("seed: 4\n")
    assert main(["run", str(run), "--overrides", str(over)]) == 0
    assert calls == [("generate", 4), ("prepare", 4), ("train", 4), ("eval", 4)]


def test_run_stops_at_the_first_failing_stage(tmp_path, monkeypatch):
    calls = []
    for name, module in STAGES.items():
        mod = importlib.import_module(module)
        rc = 3 if name == "prepare" else 0
        monkeypatch.setattr(mod, "stage", lambda cfg, _n=name, _rc=rc: calls.append(_n) or _rc)
    run = tmp_path / "r.yml"
    run.write_text("target: {path: /m}\nstages: [generate, prepare, train]\n")
    assert main(["run", str(run)]) == 3
    assert calls == ["generate", "prepare"]


@pytest.mark.parametrize(("node_rank", "want"),
                         [(0, ["generate", "prepare", "train", "eval"]), (1, ["train"])])
def test_the_other_nodes_of_a_multi_node_run_train_only(tmp_path, monkeypatch, caplog, node_rank, want):
    """Node 0 generates, prepares and evaluates (global rank 0, on node 0, writes the export); the other
    nodes take part in train alone, saying why they skip the rest."""
    import logging

    calls = []
    for name, module in STAGES.items():
        mod = importlib.import_module(module)
        monkeypatch.setattr(mod, "stage", lambda cfg, _n=name: calls.append(_n) or 0)
        monkeypatch.setattr(mod, "up_to_date", lambda cfg: None, raising=False)
    run = tmp_path / "r.yml"
    run.write_text("target: {path: /m}\nstages: [generate, prepare, train, eval]\n"
                   "train: {placement: {nnodes: 2, rdzv_endpoint: '10.0.0.1:29500'}}\n")
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert main(["run", str(run), "--set", f"train.placement.node_rank={node_rank}"]) == 0
    assert calls == want
    if node_rank:
        assert "stage generate skipped: node 0 runs it (this is node 1 of 2)" in caplog.text
