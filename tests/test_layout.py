"""`trainer.layout.RunLayout`: the one place that knows where a run's files are."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainer.config import load_run_config
from trainer.layout import RunLayout


def cfg_of(tmp_path: Path, text: str):
    p = tmp_path / "lay.yml"
    p.write_text("target: {path: /m}\n" + text)
    return load_run_config(p)


def test_default_layout(tmp_path):
    lay = RunLayout.of(cfg_of(tmp_path, ""))
    root = Path("runs/lay")
    assert lay.root == root
    assert lay.shards == root / "shards"
    # eval scores the held-out conversations (data.heldout_share 0.01 by default)
    assert (lay.eval_shards, lay.eval_split) == (lay.heldout_shards, "heldout")
    assert lay.heldout_shards == root / "shards-heldout"
    assert lay.generate_output == root / "generated"
    assert lay.completions == str(root / "generated")
    assert lay.generate_manifest == root / "generated" / "manifest.json"
    assert lay.generate_rejects == root / "generated" / "_state" / "rejects.ndjson"
    assert lay.checkpoints == root / "checkpoints"
    assert lay.launch_config == root / "launch" / "config.yml"
    assert lay.eval_result(42) == root / "eval" / "step-0000042.json"
    assert lay.fetched_completions == root / "completions"


def test_config_fields_move_the_paths(tmp_path):
    cfg = cfg_of(tmp_path, "run_dir: /r/{name}\ndata: {shards: /abs/sh, completions: 's3://b/c'}\n"
                           "eval: {shards: held-out}\ngenerate: {output: gen}\n")
    lay = RunLayout.of(cfg, base="/ignored")
    assert lay.root == Path("/r/lay")
    assert lay.shards == Path("/abs/sh")  # absolute stays
    assert lay.eval_shards == Path("/r/lay/held-out")  # relative is under the run dir
    assert lay.eval_split == "eval.shards"
    assert lay.generate_output == Path("/r/lay/gen")
    assert lay.completions == "s3://b/c"


def test_base_resolves_a_relative_run_dir_and_the_layout_is_frozen(tmp_path):
    lay = RunLayout.of(cfg_of(tmp_path, ""), base=tmp_path)
    assert lay.root == tmp_path / "runs" / "lay"
    assert lay.to_json()["checkpoints"] == str(tmp_path / "runs" / "lay" / "checkpoints")
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.root = Path("/x")  # type: ignore[misc]


def test_the_layout_root_is_run_dir_with_the_name_substituted(tmp_path):
    cfg = cfg_of(tmp_path, "run_dir: out/{name}-x\n")
    assert RunLayout.of(cfg).root == Path("out/lay-x")


def test_the_generate_spool_is_where_the_layout_says(tmp_path):
    from trainer.generate.store import ShardStore

    lay = RunLayout.of(cfg_of(tmp_path, f"run_dir: {tmp_path}/r\n"))
    store = ShardStore(lay.generate_output)
    try:
        assert store.state == lay.generate_state
    finally:
        store.close()


def test_checkpoint_and_eval_names_agree(tmp_path):
    from trainer.dflash.checkpoint import step_dir_name

    lay = RunLayout.of(cfg_of(tmp_path, ""))
    assert lay.eval_result(100).stem == step_dir_name(100) == "step-0000100"
