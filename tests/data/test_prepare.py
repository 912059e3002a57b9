"""`prepare` end to end: generator output (local or S3) -> shards + manifest + doctor, via the run config."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from data_factory import healthy, record, write_jsonl

from trainer.config import load_run_config
from trainer.data.prepare import prepare
from trainer.data.shards import MANIFEST, DataRefused, ShardDataset, check_doctor
from trainer.data.stage import stage


def _generator_output(out: Path, n: int = 60) -> None:
    """What trainer/generate leaves in <run_dir>/generated/: sealed shards plus state that is not data."""
    write_jsonl(out / "part-00000-ab12.jsonl.zst", [healthy(i) for i in range(n // 2)], zst=True)
    write_jsonl(out / "part-00001-ab12.jsonl", [healthy(i) for i in range(n // 2, n)])
    (out / "manifest.json").write_text(json.dumps({"shards": []}))
    (out / "_state" / "open").mkdir(parents=True)
    (out / "_state" / "open" / "part-00002-ab12.jsonl").write_text('{"id": "torn", "mess')
    (out / "_state" / "rejects.ndjson").write_text('{"id": "r1", "reason": "too long"}\n')


def _run_config(tmp: Path, tok_dir: Path, **data: Any) -> Path:
    cfg = {"name": "t", "run_dir": str(tmp / "run"), "target": {"path": str(tok_dir)},
           "data": {"num_workers": 1, "max_length": 1024, "heldout_share": 0, **data}}  # split: test_split
    path = tmp / "t.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_stage_reads_the_generator_output_and_passes(tmp_path: Path, tiny_tok_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _generator_output(tmp_path / "run" / "generated")
    cfg = load_run_config(_run_config(tmp_path, tiny_tok_dir))
    assert stage(cfg) == 0
    assert "PASSED" in capsys.readouterr().out
    shards = tmp_path / "run" / "shards"
    check_doctor(shards)
    ds = ShardDataset.open(shards)
    assert len(ds) == 60 and ds[0]["id"] == "s0" and ds[59]["id"] == "s59"
    m = json.loads((shards / MANIFEST).read_text())
    assert m["counts"] == {"records": 60, "samples": 60, "rows": 60, "dropped_degenerate": 0,
                           "tokens": sum(ds.lengths), "supervised_tokens": m["counts"]["supervised_tokens"]}
    assert m["counts"]["supervised_tokens"] == sum(sum(ds[i]["loss_mask"]) for i in range(len(ds)))
    assert len(m["source"]["files"]) == 2  # _state/ and manifest.json are not records


def test_stage_refuses_a_mostly_empty_set(tmp_path: Path, tiny_tok_dir: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    recs = [record(i, "", "") if i % 100 < 87 else healthy(i) for i in range(100)]
    write_jsonl(tmp_path / "run" / "generated" / "part-00000-x.jsonl", recs)
    assert stage(load_run_config(_run_config(tmp_path, tiny_tok_dir))) == 1
    out = capsys.readouterr()
    assert "87.0% empty responses" in out.out and "REFUSED" in out.err
    with pytest.raises(DataRefused):
        check_doctor(tmp_path / "run" / "shards")


def test_stage_reports_bad_input_with_file_and_line(tmp_path: Path, tiny_tok_dir: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    gen = tmp_path / "run" / "generated"
    write_jsonl(gen / "part-00000-x.jsonl", [healthy(0)])
    with open(gen / "part-00000-x.jsonl", "a") as fh:
        fh.write('{"id": "s1", "messages": [{"role": "user", "content": "q"}]}\n')
    assert stage(load_run_config(_run_config(tmp_path, tiny_tok_dir))) == 2
    assert "part-00000-x.jsonl:2: no assistant turn" in capsys.readouterr().err
    assert stage(load_run_config(_run_config(tmp_path, tmp_path / "no-tokenizer"))) == 2
    assert "no-tokenizer: no such directory" in capsys.readouterr().err


@pytest.mark.slow
def test_parallel_workers_write_identical_shards(tmp_path: Path, tiny_tok_dir: Path) -> None:
    write_jsonl(tmp_path / "gen" / "a.jsonl", [healthy(i) for i in range(200)])
    one = prepare(tmp_path / "gen", tmp_path / "one", tiny_tok_dir, num_workers=1, show_progress=False)
    two = prepare(tmp_path / "gen", tmp_path / "two", tiny_tok_dir, num_workers=2, show_progress=False)
    assert [f["sha256"] for f in one.manifest["shards"]] == [f["sha256"] for f in two.manifest["shards"]]
    assert one.manifest["samples"]["sha256"] == two.manifest["samples"]["sha256"]


def test_corrupt_shard_is_detected(tmp_path: Path, tiny_tok_dir: Path) -> None:
    write_jsonl(tmp_path / "gen" / "a.jsonl", [healthy(i) for i in range(10)])
    prepare(tmp_path / "gen", tmp_path / "s", tiny_tok_dir, num_workers=1, show_progress=False)
    shard = tmp_path / "s" / "shard-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataRefused, match="sha256 mismatch"):
        ShardDataset.open(tmp_path / "s", verify=True)
    shard.write_bytes(bytes(data[:-10]))
    with pytest.raises(DataRefused, match="size"):
        ShardDataset.open(tmp_path / "s")


def test_stage_from_s3_and_upload_of_the_shards(s3_server: Any, tmp_path: Path, tiny_tok_dir: Path) -> None:
    """Completions on S3 (moto on loopback) are synced down, prepared, and the shards synced back up."""
    from trainer.config import S3Config
    from trainer.data.sync import S3Sync
    from trainer.s3 import make_client

    client = make_client(S3Config(endpoint_url=s3_server.endpoint_url))
    client.create_bucket(Bucket="runs-prep")
    _generator_output(tmp_path / "local-gen", n=20)
    S3Sync(client, "runs-prep", "t/generated", show_progress=False).upload(tmp_path / "local-gen")
    path = _run_config(tmp_path, tiny_tok_dir, completions="s3://runs-prep/t/generated", upload_shards=True)
    raw = yaml.safe_load(path.read_text())
    raw["s3"] = {"bucket": "runs-prep", "prefix": "t", "endpoint_url": s3_server.endpoint_url}
    path.write_text(yaml.safe_dump(raw))
    assert stage(load_run_config(path)) == 0
    assert not (tmp_path / "run" / "completions" / "_state").exists()  # only the sealed shards came down
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="runs-prep", Prefix="t/shards/")["Contents"]}
    assert {"t/shards/manifest.json", "t/shards/shard-00000.arrow", "t/shards/samples.arrow"} <= keys
    S3Sync(client, "runs-prep", "t/shards", show_progress=False).download(tmp_path / "node2")
    assert len(ShardDataset.open(tmp_path / "node2", verify=True)) == 20
    check_doctor(tmp_path / "node2")


def test_stage_with_no_sample_is_bad_input_and_writes_no_shards(tmp_path: Path, tiny_tok_dir: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    gen = tmp_path / "run" / "generated"
    gen.mkdir(parents=True)
    (gen / "part-00000-x.jsonl").write_text("\n")
    assert stage(load_run_config(_run_config(tmp_path, tiny_tok_dir))) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "prepare: no sample in" in err[0] and "1 files" in err[0]
    assert not (tmp_path / "run" / "shards" / MANIFEST).exists()


def test_a_refusal_names_the_option_of_each_failed_check(tmp_path: Path, tiny_tok_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    same = "We add the numbers carefully and check every step twice. " * 8
    recs = [record(i, "The answer is 4.", same, question=f"question {i}") for i in range(20)]
    write_jsonl(tmp_path / "run" / "generated" / "part-00000-x.jsonl", recs)
    assert stage(load_run_config(_run_config(tmp_path, tiny_tok_dir))) == 1
    err = capsys.readouterr().err
    assert "duplicate responses" in err and "--max-duplicate-share ...`" in err
    assert "--max-degenerate-share" not in err
    # the doctor takes the run file as other subcommands do: its shards, its thresholds
    from trainer.cli import main

    run_file = str(tmp_path / "t.yml")
    assert main(["doctor", run_file, "--dry-run"]) == 1
    assert main(["doctor", run_file, "--dry-run", "--max-duplicate-share", "1"]) == 0
