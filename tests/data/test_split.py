"""The held-out split: conversations chosen by a hash of their prompt (the normalized first user turn) go
to their own shards, which training never reads; the doctor reports on both; eval's default shards are the
held-out ones."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from data_factory import healthy, write_jsonl

from trainer.config import ConfigError, load_run_config
from trainer.data.shards import MANIFEST, ShardDataset, check_doctor
from trainer.data.split import is_heldout, split_key
from trainer.data.stage import stage
from trainer.layout import RunLayout


def multi_turn(i: int) -> dict[str, Any]:
    """A 3-turn conversation as the generator writes it: prepare makes 3 rows of it."""
    rec = healthy(i)
    for t in (2, 3):
        rec["messages"] += [{"role": "user", "content": f"and turn {t} of {i}?"},
                            {"role": "assistant", "content": f"Turn {t}: {i * t}.",
                             "reasoning_content": f"Multiply {i} by {t}. " * (1 + i % 3)}]
    return rec


def run_config(tmp: Path, tok_dir: Path, **data: Any) -> Path:
    cfg = {"name": "t", "run_dir": str(tmp / "run"), "target": {"path": str(tok_dir)},
           "data": {"num_workers": 1, "max_length": 1024, **data}}
    path = tmp / "t.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def ids(directory: Path) -> list[str]:
    ds = ShardDataset.open(directory)
    return [ds[i]["id"] for i in range(len(ds))]


def test_the_held_out_ids_never_reach_the_training_shards(tmp_path: Path, tiny_tok_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "run" / "generated" / "part-00000-ab.jsonl", [multi_turn(i) for i in range(80)])
    cfg = load_run_config(run_config(tmp_path, tiny_tok_dir, heldout_share=0.2))
    assert stage(cfg) == 0
    layout = RunLayout.of(cfg)
    expected = {f"s{i}" for i in range(80) if is_heldout(split_key(multi_turn(i)["messages"], f"s{i}"), 0.2)}
    assert 5 < len(expected) < 30
    train, held = ids(layout.shards), ids(layout.heldout_shards)
    assert set(held) == expected and not expected & set(train)
    assert len(held) == 3 * len(expected) and len(train) == 3 * (80 - len(expected))  # every turn's row
    manifest = json.loads((layout.shards / MANIFEST).read_text())
    held_manifest = json.loads((layout.heldout_shards / MANIFEST).read_text())
    assert manifest["heldout"] == {"share": 0.2, "dir": str(layout.heldout_shards),
                                   "records": len(expected), "rows": 3 * len(expected)}
    assert (manifest["split"], held_manifest["split"]) == ("training", "heldout")
    assert held_manifest["doctor"]["passed"] and check_doctor(layout.shards)["passed"]
    printed = capsys.readouterr().out
    assert f"held out {len(expected)} conversations" in printed and "training never reads them" in printed
    assert printed.count("doctor:") >= 2  # a report on each side
    assert layout.eval_shards == layout.heldout_shards and layout.eval_split == "heldout"


def test_the_same_prompt_under_two_ids_stays_on_one_side(tmp_path: Path, tiny_tok_dir: Path) -> None:
    """A prompt sampled twice (two ids, two answers; its whitespace differing) never lands on both sides,
    which a split by id would do for about 2 * share * (1 - share) of such pairs."""
    records = []
    for i in range(60):
        a, b = healthy(i), healthy(i + 1000)
        b["messages"][1]["content"] = "  " + a["messages"][1]["content"].replace(" ", "\u00a0 ") + "\n"
        records += [a, b]
    write_jsonl(tmp_path / "run" / "generated" / "part-00000-ab.jsonl", records)
    cfg = load_run_config(run_config(tmp_path, tiny_tok_dir, heldout_share=0.3))
    assert stage(cfg) == 0
    layout = RunLayout.of(cfg)
    held, train = set(ids(layout.heldout_shards)), set(ids(layout.shards))
    assert len(held) > 5 and not held & train
    pairs_held = {i for i in range(60) if f"s{i}" in held}
    assert pairs_held and {f"s{i + 1000}" for i in pairs_held} <= held
    assert {f"s{i}" for i in range(60) if i not in pairs_held} <= train
    assert {f"s{i + 1000}" for i in range(60) if i not in pairs_held} <= train
    # by id alone, some pair would have been split
    assert any(is_heldout(f"s{i}", 0.3) != is_heldout(f"s{i + 1000}", 0.3) for i in range(60))


def test_a_conversation_without_a_user_turn_is_split_by_its_id() -> None:
    assert split_key([{"role": "assistant", "content": "hi"}], "r7") == "id:r7"
    assert split_key([{"role": "user", "content": " a\tb  c "}], "r7") == split_key(
        [{"role": "system", "content": "x"}, {"role": "user", "content": "a b\nc"}], "other")


def test_the_split_is_the_same_on_every_prepare(tmp_path: Path, tiny_tok_dir: Path) -> None:
    write_jsonl(tmp_path / "run" / "generated" / "part-00000-ab.jsonl", [healthy(i) for i in range(60)])
    cfg = load_run_config(run_config(tmp_path, tiny_tok_dir, heldout_share=0.25))
    assert stage(cfg) == 0
    first = ids(RunLayout.of(cfg).heldout_shards)
    assert stage(cfg) == 0
    assert ids(RunLayout.of(cfg).heldout_shards) == first and first


def test_without_a_share_eval_scores_the_training_shards(tmp_path: Path, tiny_tok_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "run" / "generated" / "part-00000-ab.jsonl", [healthy(i) for i in range(40)])
    cfg = load_run_config(run_config(tmp_path, tiny_tok_dir, heldout_share=0))
    assert stage(cfg) == 0
    layout = RunLayout.of(cfg)
    assert not layout.heldout_shards.exists() and len(ids(layout.shards)) == 40
    assert (layout.eval_shards, layout.eval_split) == (layout.shards, "training")
    assert "no held-out split" in capsys.readouterr().out


def test_split_settings_are_checked_with_the_key_named(tmp_path: Path, tiny_tok_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.heldout_share must be within \[0, 0\.5\]"):
        load_run_config(run_config(tmp_path, tiny_tok_dir, heldout_share=0.7))
    with pytest.raises(ConfigError, match=r"data\.heldout_shards must be a dir of its own"):
        load_run_config(run_config(tmp_path, tiny_tok_dir, heldout_shards="shards"))
    default = load_run_config(run_config(tmp_path, tiny_tok_dir))
    assert (default.data.heldout_share, default.data.heldout_shards) == (0.01, "shards-heldout")
