"""The doctor: a set that is mostly empty responses (87%) is refused with a report that says so; healthy
data passes; `check_doctor` (what `train` calls) refuses unchecked or refused data unless overridden."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from data_factory import healthy, record, write_jsonl

from trainer.cli import main
from trainer.data.config import DoctorConfig
from trainer.data.prepare import prepare
from trainer.data.shards import MANIFEST, DataRefused, ShardDataset, check_doctor


def mostly_empty(n: int = 100) -> list[dict[str, Any]]:
    """87% of the responses empty: the template tokens around nothing (loss_mask sum a constant)."""
    return [record(i, "", "") if i % 100 < 87 else healthy(i) for i in range(n)]


def _prepare(tmp: Path, tok_dir: Path, records: list[dict[str, Any]], **kw: Any) -> Any:
    write_jsonl(tmp / "gen" / "part-0.jsonl", records)
    return prepare(tmp / "gen", tmp / "shards", tok_dir, num_workers=1, show_progress=False, **kw)


def test_mostly_empty_set_is_refused_with_a_report_that_says_so(tmp_path: Path, tiny_tok_dir: Path) -> None:
    res = _prepare(tmp_path, tiny_tok_dir, mostly_empty())
    v = res.verdict
    assert not v.passed
    assert v.stats["share"]["empty_response"] == pytest.approx(0.87)
    assert "87.0% of samples are degenerate (87.0% empty responses" in v.report
    mode = v.stats["supervised_tokens_mode"]
    assert f"87.0% of samples have exactly {mode['value']} supervised tokens" in v.report
    assert "REFUSED" in v.report
    with pytest.raises(DataRefused, match=r"the doctor refused this data: 87\.0% of samples are degenerate"):
        check_doctor(tmp_path / "shards")
    assert check_doctor(tmp_path / "shards", allow_unchecked=True)["passed"] is False  # explicit override
    assert res.manifest["counts"]["dropped_degenerate"] == 87


def test_healthy_dataset_passes_and_shards_hold_the_rows(tmp_path: Path, tiny_tok_dir: Path) -> None:
    res = _prepare(tmp_path, tiny_tok_dir, [healthy(i) for i in range(120)], rows_per_shard=50)
    assert res.verdict.passed, res.verdict.report
    assert check_doctor(tmp_path / "shards")["passed"]
    ds = ShardDataset.open(tmp_path / "shards", verify=True)
    assert len(ds) == 120 and len(res.manifest["shards"]) == 3
    assert ds.lengths == [len(ds[i]["input_ids"]) for i in range(len(ds))]
    row = ds[5]
    assert row["id"] == "s5" and len(row["loss_mask"]) == len(row["input_ids"]) and sum(row["loss_mask"]) > 8
    m = json.loads((tmp_path / "shards" / MANIFEST).read_text())
    assert m["counts"]["rows"] == 120 and sum(m["length_histogram"].values()) == 120
    assert all(len(f["sha256"]) == 64 for f in m["shards"])


@pytest.mark.parametrize(("records", "needle"), [
    ([healthy(7)] * 40 + [healthy(i) for i in range(40)], "duplicate responses"),
    ([record(i, "", "thinking on and on " * 3, finish="length") for i in range(30)]
     + [healthy(i) for i in range(20)], "unterminated <think> blocks"),
])
def test_other_checks_refuse(tmp_path: Path, tiny_tok_dir: Path, records: list[Any], needle: str) -> None:
    v = _prepare(tmp_path, tiny_tok_dir, records).verdict
    assert not v.passed and any(needle in r for r in v.reasons), v.report


def test_truncation_rate_is_reported_and_limited(tmp_path: Path, tiny_tok_dir: Path) -> None:
    v = _prepare(tmp_path, tiny_tok_dir, [healthy(i) for i in range(30)], max_length=64).verdict
    assert v.stats["share"]["truncated"] > 0.5 and any("truncated at max_length" in r for r in v.reasons)


def test_check_doctor_refuses_unchecked_and_changed_data(tmp_path: Path, tiny_tok_dir: Path) -> None:
    _prepare(tmp_path, tiny_tok_dir, [healthy(i) for i in range(20)])
    shards = tmp_path / "shards"
    m = json.loads((shards / MANIFEST).read_text())
    m["shards"][0]["sha256"] = "0" * 64  # the data the doctor judged is not this data any more
    (shards / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(DataRefused, match="verdict is for other data"):
        check_doctor(shards)
    del m["doctor"]
    (shards / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(DataRefused, match="has not checked this data"):
        check_doctor(shards)
    with pytest.raises(DataRefused, match=r"no manifest\.json"):
        check_doctor(tmp_path)


def test_doctor_cli_exit_codes_and_rejudging(tmp_path: Path, tiny_tok_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _prepare(tmp_path, tiny_tok_dir, mostly_empty(100))
    shards = str(tmp_path / "shards")
    assert main(["doctor", shards]) == 1
    assert "87.0% empty responses" in capsys.readouterr().out
    # an explicit, recorded override: re-judge with looser limits, after which train accepts the data
    assert main(["doctor", shards, "--max-degenerate-share", "0.9", "--max-mode-share", "0.9"]) == 0
    assert check_doctor(shards)["thresholds"]["max_degenerate_share"] == 0.9
    capsys.readouterr()
    assert main(["doctor", str(tmp_path / "gen"), "--tokenizer", str(tiny_tok_dir), "--workers", "1",
                 "--json"]) == 1
    out = json.loads(capsys.readouterr().out)  # raw completions, checked without writing shards
    assert out["passed"] is False and out["stats"]["share"]["empty_response"] == pytest.approx(0.87)
    assert main(["doctor", str(tmp_path / "gen")]) == 2  # raw completions need --tokenizer
    assert main(["doctor", shards, "--max-degenerate-share", "3"]) == 2


def test_degenerate_definition() -> None:
    from trainer.data.doctor import degenerate_flags

    cols = {"answer_chars": [0, 5, 5, 5], "reasoning_chars": [0, 0, 9, 9], "n_supervised": [6, 5, 40, 40],
            "longest_run": [6, 5, 40, 1]}
    assert degenerate_flags(cols, DoctorConfig(min_supervised_tokens=8)) == [True, True, False, True]
