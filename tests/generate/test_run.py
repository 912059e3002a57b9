"""End-to-end runs of `generate` against SGLang doubles (tests/doubles/sglang_server.py, a stand-in for
SGLang, which cannot serve on CPU): exactly-once across kill -9, endpoint failover, S3 outages (moto's
real S3 HTTP server), rejects and flagged completions."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from genhelpers import ROOT, check_output, read_output, trainer_env, write_prompts, write_run

from trainer.config import ConfigError, load_run_config
from trainer.generate.stage import stage
from trainer.layout import RunLayout

FAST = ("--reasoning-parser", "qwen3", "--latency", "0.02", "--max-running", "24")


def run_stage(cfg_path: Path) -> tuple[int, dict[str, Any]]:
    cfg = load_run_config(cfg_path)
    rc = stage(cfg)
    summary = RunLayout.of(cfg).root / cfg.generate.output / "_state" / "summary.json"
    return rc, (json.loads(summary.read_text()) if summary.exists() else {})


def done_count(out: Path) -> int:
    """Completions on disk: sealed sidecars + lines of the open shards. The running stage seals (moves) an
    open shard at any moment: a file gone between the listing and the read means count again, and an open
    shard whose sidecar is already written (sealing, between the two steps) counts once, as sealed."""
    while True:
        try:
            sealed = {p.stem: p for p in (out / "_state" / "manifest").glob("*.json")}
            n = sum(json.loads(p.read_text())["records"] for p in sealed.values())
            still_open = [p for p in (out / "_state" / "open").glob("*.jsonl")
                          if p.name.split(".")[0] not in sealed]
            return n + sum(p.read_bytes().count(b"\n") for p in still_open)
        except FileNotFoundError:
            continue


def spawn(cfg_path: Path, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainer", "generate", str(cfg_path), *extra], cwd=ROOT,
                            env=trainer_env(), stdout=log.open("ab"), stderr=subprocess.STDOUT)


def wait_until(pred: Any, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"generate exited with {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_kill_9_twice_then_resume_gives_every_id_exactly_once(tmp_path: Path, sglang: Any) -> None:
    eps = [sglang(*FAST).url for _ in range(3)]
    expected = write_prompts(tmp_path / "prompts.jsonl", 2000, bad=True)
    # the endpoints come from --set, as the train.yml playbook passes them
    cfg = write_run(tmp_path, tmp_path / "prompts.jsonl", ["http://127.0.0.1:9"], shard_records=150)
    endpoints = f"--set=generate.endpoints=[{','.join(eps)}]"
    out = tmp_path / "run" / "generated"
    log = tmp_path / "generate.log"
    rng = random.Random()
    points = sorted(rng.sample(range(150, 1800), 2))
    print(f"kill -9 after {points} completions")  # shown by pytest when the test fails
    for point in points:
        proc = spawn(cfg, log, endpoints)
        wait_until(lambda p=point: out.exists() and done_count(out) >= p, 120, f"{point} completions", proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before_last = done_count(out)
    proc = spawn(cfg, log, endpoints)
    assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
    check_output(out, expected)
    assert not list((out / "_state" / "open").iterdir())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"] == 2000 and manifest["complete"] is True, f"kill points {points}"
    summary = json.loads((out / "_state" / "summary.json").read_text())
    assert summary["completed"] == 2000 - before_last and summary["skipped_done"] == before_last
    rejects = [json.loads(x) for x in (out / "_state" / "rejects.ndjson").read_text().splitlines()]
    assert len(rejects) == 40  # rewritten by each run, not appended
    reasons = {r["reason"].split(":")[0].split(" (")[0] for r in rejects}
    assert {"invalid JSON", "no user turn with content", "over-long", "duplicate id 's00000'"} == reasons
    assert all(r["source"].endswith("prompts.jsonl") and r["line"] > 0 for r in rejects)


def test_an_endpoint_dying_mid_run_loses_nothing(tmp_path: Path, sglang: Any) -> None:
    dying = sglang(*FAST, "--die-after", "60")
    eps = [sglang(*FAST).url, dying.url, sglang(*FAST).url]
    expected = write_prompts(tmp_path / "p.jsonl", 300)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", eps))
    assert rc == 0
    check_output(tmp_path / "run" / "generated", expected)
    dead = summary["endpoints"][dying.url]
    assert dead["completed"] <= 60 and dead["downs"] >= 1 and dead["state"] == "down"
    assert summary["completed"] == 300 and summary["requeued"] >= 1
    assert dying.proc.poll() == 3


def test_a_hung_endpoint_times_out_and_its_work_moves(tmp_path: Path, sglang: Any) -> None:
    hung = sglang("--latency", "60", "--max-running", "8")
    eps = [hung.url, sglang(*FAST).url]
    expected = write_prompts(tmp_path / "p.jsonl", 100)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", eps, request_timeout_s=1.0,
                                      backoff_initial_s=30.0, backoff_max_s=30.0))
    assert rc == 0
    check_output(tmp_path / "run" / "generated", expected)
    assert summary["endpoints"][hung.url]["completed"] == 0
    assert summary["endpoints"][hung.url]["downs"] == 1


def test_server_errors_are_retried_and_windows_respected(tmp_path: Path, sglang: Any) -> None:
    flaky = [sglang(*FAST, "--error-rate", "0.25", "--seed", str(i), "--max-running", "8") for i in range(3)]
    expected = write_prompts(tmp_path / "p.jsonl", 150)
    cfg = write_run(tmp_path, tmp_path / "p.jsonl", [d.url for d in flaky], max_attempts=12,
                    failures_to_down=4)
    rc, summary = run_stage(cfg)
    assert rc == 0
    check_output(tmp_path / "run" / "generated", expected)
    # a 500 sent while its endpoint was being put aside is cancelled unseen, hence <=
    injected = sum(d.stats()["errors"] for d in flaky)
    assert 0 < summary["server_errors"] <= injected
    assert all(e["capacity"] == 8 for e in summary["endpoints"].values())  # window = max_running_requests


def test_flagged_completions_are_retried_with_a_larger_budget(tmp_path: Path, sglang: Any) -> None:
    d = sglang(*FAST, "--context-length", "400")
    expected = write_prompts(tmp_path / "p.jsonl", 60)
    long_prompt = {"id": "too-long-for-the-endpoint", "messages": [{"role": "user", "content": "w " * 300}]}
    with (tmp_path / "p.jsonl").open("a") as fh:
        fh.write(json.dumps(long_prompt) + "\n")
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], max_tokens=30,
                                      retry_flagged=True, retry_max_tokens=200))
    assert rc == 0
    check_output(tmp_path / "run" / "generated", expected)  # every finish_reason is "stop" after the retry
    assert summary["retried_flagged"] > 0 and summary["flagged"] == {}
    lines = (tmp_path / "run/generated/_state/rejects.ndjson").read_text().splitlines()
    (rej,) = [json.loads(x) for x in lines]
    assert rej["id"] == "too-long-for-the-endpoint" and "maximum context length" in rej["reason"]
    assert summary["rejected_by_endpoint"] == 1


def test_flagged_completions_are_kept_and_counted_without_retry(tmp_path: Path, sglang: Any) -> None:
    d = sglang(*FAST)
    write_prompts(tmp_path / "p.jsonl", 60)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], max_tokens=30))
    assert rc == 0
    records = read_output(tmp_path / "run" / "generated")
    assert len(records) == 60
    length = [r for r in records if r["finish_reason"] == "length"]
    assert length and summary["flagged"].get("length") == len(length)
    assert all(r["usage"]["completion_tokens"] == 30 for r in length)
    # the progress file `python -m trainer status` reads, as the last tick left it
    progress = json.loads((tmp_path / "run" / "generated" / "_state" / "progress.json").read_text())
    assert (progress["done"], progress["total"], progress["rejected"], progress["eta_s"]) == (60, 60, 0, 0.0)


@pytest.mark.slow
def test_s3_outage_mid_run_finishes_with_a_consistent_manifest(tmp_path: Path, sglang: Any,
                                                               s3_server: Any) -> None:
    bucket = "gen-outage"
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    eps = [sglang("--reasoning-parser", "qwen3", "--latency", "0.1", "--max-running", "16").url
           for _ in range(2)]
    expected = write_prompts(tmp_path / "p.jsonl", 1200)
    cfg = write_run(tmp_path, tmp_path / "p.jsonl", eps, shard_records=100,
                    s3={"bucket": bucket, "prefix": "runs/gen", "endpoint_url": s3_server.endpoint_url})
    out = tmp_path / "run" / "generated"
    log = tmp_path / "generate.log"
    proc = spawn(cfg, log)
    try:
        wait_until(lambda: out.exists() and done_count(out) >= 250, 120, "250 completions", proc)
        s3_server.stop()
        wait_until(lambda: done_count(out) >= 700, 120, "700 completions during the outage", proc)
        s3_server.start()
        s3.create_bucket(Bucket=bucket)  # moto restarts empty: S3 came back without the objects
        assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if not s3_server.running:
            s3_server.start()
        proc.kill()
    assert "completions stay spooled locally" in log.read_text()
    check_output(out, expected)
    manifest = json.loads(s3.get_object(Bucket=bucket, Key="runs/gen/generated/manifest.json")["Body"].read())
    assert manifest["records"] == 1200 and manifest["complete"] is True
    seen: list[str] = []
    for shard in manifest["shards"]:
        obj = s3.get_object(Bucket=bucket, Key=f"runs/gen/generated/{shard['shard']}")
        data = obj["Body"].read()
        assert len(data) == shard["bytes"] and obj["Metadata"]["sha256"] == shard["sha256"]
        assert data == (out / shard["shard"]).read_bytes()
        side = json.loads(s3.get_object(Bucket=bucket, Key="runs/gen/generated/_state/manifest/"
                                        + shard["shard"].split(".")[0] + ".json")["Body"].read())
        assert side["sha256"] == shard["sha256"]
        seen.extend(side["ids"])
    assert sorted(seen) == sorted(expected)


def test_a_new_node_resumes_from_s3_without_redoing_work(tmp_path: Path, sglang: Any, s3_server: Any) -> None:
    bucket = "gen-newnode"
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    s3cfg = {"bucket": bucket, "prefix": "p", "endpoint_url": s3_server.endpoint_url}
    first = sglang(*FAST)
    write_prompts(tmp_path / "part.jsonl", 150)
    rc, _ = run_stage(write_run(tmp_path / "node1", tmp_path / "part.jsonl", [first.url], s3=s3cfg))
    assert rc == 0 and first.stats()["served"] == 150
    second = sglang(*FAST)
    expected = write_prompts(tmp_path / "all.jsonl", 250)  # same ids and prompts, 100 more
    rc, summary = run_stage(write_run(tmp_path / "node2", tmp_path / "all.jsonl", [second.url], s3=s3cfg))
    assert rc == 0
    assert second.stats()["served"] == 100 and summary["skipped_done"] == 150
    check_output(tmp_path / "node2" / "run" / "generated", expected)


def test_no_healthy_endpoint_fails_with_the_endpoints_named(tmp_path: Path, caplog: Any) -> None:
    from genhelpers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    write_prompts(tmp_path / "p.jsonl", 5)
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [url], all_down_timeout_s=1.5))
    assert rc == 1
    assert f"no healthy endpoint for 2s (generate.all_down_timeout_s): {url} down" in caplog.text


def test_a_wrong_api_key_disables_the_endpoint(tmp_path: Path, sglang: Any, caplog: Any,
                                               monkeypatch: Any) -> None:
    d = sglang(*FAST, "--api-key", "right")
    write_prompts(tmp_path / "p.jsonl", 5)
    monkeypatch.setenv("SGLANG_API_KEY", "wrong")
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url]))
    assert rc == 1 and "every endpoint is disabled" in caplog.text and "HTTP 401" in caplog.text
    monkeypatch.setenv("SGLANG_API_KEY", "right")
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url]))
    assert rc == 0 and summary["completed"] == 5


def test_the_key_is_not_sent_over_plain_http_to_another_host(tmp_path: Path, monkeypatch: Any) -> None:
    """With a key set, an http:// endpoint that is not loopback is refused before anything is read or sent;
    https://, loopback and an explicit generate.allow_plain_http_key pass that check."""
    write_prompts(tmp_path / "p.jsonl", 1)
    monkeypatch.setenv("SGLANG_API_KEY", "k")
    remote = ["http://127.0.0.1:1", "http://10.0.1.20:30000"]
    refused = (r"refusing to send the API key \(\$SGLANG_API_KEY\) over plain HTTP "
               r"to http://10\.0\.1\.20:30000: .*allow_plain_http_key: true")
    with pytest.raises(ConfigError, match=refused):
        stage(load_run_config(write_run(tmp_path, tmp_path / "p.jsonl", remote)))
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("part-*"))
    from trainer.generate.endpoints import plain_http_key_refusal

    ok = ["https://10.0.1.20:30000", "http://localhost:30000", "http://127.0.0.2:30000", "http://[::1]:30000"]
    cfg = load_run_config(write_run(tmp_path, tmp_path / "p.jsonl", ok)).generate
    assert plain_http_key_refusal(cfg, "k") is None
    run = write_run(tmp_path, tmp_path / "p.jsonl", remote, allow_plain_http_key=True)
    cfg = load_run_config(run).generate
    assert plain_http_key_refusal(cfg, "k") is None
    cfg = load_run_config(write_run(tmp_path, tmp_path / "p.jsonl", remote)).generate
    assert plain_http_key_refusal(cfg, "") is None, "no key: nothing to protect"


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    write_prompts(tmp_path / "p.jsonl", 1)
    with pytest.raises(ConfigError, match=r"generate\.endpoints: empty"):
        stage(load_run_config(write_run(tmp_path, tmp_path / "p.jsonl", [])))
    with pytest.raises(ConfigError, match="endpoints: 'localhost:30000' is not an http"):
        load_run_config(write_run(tmp_path, tmp_path / "p.jsonl", ["localhost:30000"]))
    with pytest.raises(ConfigError, match=r"generate\.prompts: .*missing\.jsonl does not exist"):
        stage(load_run_config(write_run(tmp_path, tmp_path / "missing.jsonl", ["http://127.0.0.1:1"])))


def test_a_new_node_does_not_start_blind_while_s3_is_down(tmp_path: Path, caplog: Any) -> None:
    from genhelpers import free_port

    write_prompts(tmp_path / "p.jsonl", 5)
    s3cfg = {"bucket": "b", "endpoint_url": f"http://127.0.0.1:{free_port()}"}
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", ["http://127.0.0.1:1"], s3=s3cfg,
                                all_down_timeout_s=0.5))
    assert rc == 1 and "the local spool is empty; not starting blind" in caplog.text
    assert not list((tmp_path / "run" / "generated").glob("part-*"))


def test_a_prompt_that_always_times_out_is_rejected_after_max_attempts(tmp_path: Path, sglang: Any) -> None:
    slow = sglang("--latency", "30", "--max-running", "4")
    write_prompts(tmp_path / "p.jsonl", 3)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [slow.url], request_timeout_s=0.5,
                                      backoff_initial_s=0.1, backoff_max_s=0.1, max_attempts=2))
    assert rc == 0 and summary["completed"] == 0 and summary["rejected_by_endpoint"] == 3
    lines = (tmp_path / "run/generated/_state/rejects.ndjson").read_text().splitlines()
    rejects = [json.loads(x) for x in lines]
    assert sorted(r["id"] for r in rejects) == ["s00000", "s00001", "s00002"]
    for r in rejects:
        assert r["reason"].startswith("failed 2 times, last: ") and "timeout after" in r["reason"]
