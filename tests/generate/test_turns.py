"""Turn-by-turn regeneration against the SGLang double (tests/doubles/sglang_server.py), read back with
the data stage's own record reader: each request holds the conversation so far, a conversation is
written whole or not at all (kill -9 between turns), its turns stay on one instance, a cut turn ends it.
Also the connections: a pooled connection the server closed at its keep-alive loses nothing and puts no
instance aside."""
from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path
from typing import Any

from genhelpers import read_output, sglang_double, write_run
from test_run import run_stage, spawn, wait_until

from trainer.data.records import iter_conversations

FAST = ("--reasoning-parser", "qwen3", "--latency", "0.02", "--max-running", "24")
SYSTEM = {"role": "system", "content": "be brief"}


def sharegpt(cid: str, users: list[str], system: bool = True) -> dict[str, Any]:
    """A ShareGPT conversation with the original answers ("old ...") after each user turn."""
    turns = [{"from": "system", "value": SYSTEM["content"]}] if system else []
    for i, u in enumerate(users):
        turns += [{"from": "human", "value": u}, {"from": "gpt", "value": f"old answer {i}"}]
    return {"id": cid, "conversations": turns}


def write_lines(path: Path, objs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def requests(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/double/requests", timeout=10) as r:
        return json.loads(r.read())["requests"]


def check_interleaved(messages: list[dict[str, Any]], users: list[str], system: bool = True) -> None:
    """system, then user i and the double's answer to exactly the conversation before it, in order."""
    head = [SYSTEM] if system else []
    assert [m["role"] for m in messages] == [m["role"] for m in head] + ["user", "assistant"] * len(users)
    assert messages[:len(head)] == head
    for i, user in enumerate(users):
        at = len(head) + 2 * i
        assert messages[at] == {"role": "user", "content": user}
        reasoning, content = sglang_double.expected_completion(messages[:at + 1])
        assert messages[at + 1]["content"] == content and messages[at + 1]["reasoning_content"] == reasoning


def so_far(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What each request of a conversation must hold: everything up to each user turn."""
    return [messages[:i + 1] for i, m in enumerate(messages) if m["role"] == "user"]


def test_three_turns_asked_in_order_and_kill_9_between_turns_2_and_3_redoes_only_that(
        tmp_path: Path, sglang: Any) -> None:
    users = ["first question", "second question", "third question [hold-s=120]"]
    prompts = write_lines(tmp_path / "p.jsonl", [sharegpt("three", users)])
    held = sglang(*FAST, "--log-requests", "--holds")  # turn 3 is held until the client is killed
    cfg = write_run(tmp_path, prompts, [held.url])
    out = tmp_path / "run" / "generated"
    log = tmp_path / "generate.log"
    proc = spawn(cfg, log)
    wait_until(lambda: len(requests(held.url)) == 3, 60, "the third turn's request", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert read_output(out) == [] and not any(p.read_bytes() for p in (out / "_state/open").glob("*"))

    fresh = sglang(*FAST, "--log-requests")
    proc = spawn(cfg, log, f"--set=generate.endpoints=[{fresh.url}]")
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    (conv,) = list(iter_conversations(out))
    assert conv.id == "three" and conv.finish_reason == "stop"
    check_interleaved(conv.messages, users)
    # every request holds exactly the conversation so far, answers with their reasoning_content
    expect = so_far(conv.messages)
    assert [r["messages"] for r in requests(fresh.url)] == expect
    assert [r["messages"] for r in requests(held.url)] == expect  # the killed run asked the same
    (record,) = read_output(out)
    assert [t["finish_reason"] for t in record["turns"]] == ["stop"] * 3
    turn_tokens = sum(t["usage"]["completion_tokens"] for t in record["turns"])
    assert record["usage"]["completion_tokens"] == turn_tokens
    print(f"requests: {len(requests(held.url))} before kill -9, {len(requests(fresh.url))} after; "
          f"completions written: {len(read_output(out))} with {len(record['turns'])} answered turns")


def test_turns_stay_on_one_instance_and_every_conversation_is_whole(tmp_path: Path, sglang: Any) -> None:
    doubles = [sglang(*FAST, "--max-running", "4") for _ in range(3)]
    convs = {f"c{i}": [f"q{i}.{t}" for t in range(1 + i % 4)] for i in range(40)}
    write_lines(tmp_path / "p.jsonl", [sharegpt(c, u, system=bool(i % 2)) for i, (c, u) in
                                       enumerate(convs.items())])
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url for d in doubles]))
    assert rc == 0 and summary["completed"] == 40
    assert summary["turns"] == sum(len(u) for u in convs.values())
    for rec in read_output(tmp_path / "run" / "generated"):
        check_interleaved(rec["messages"], convs[rec["id"]], system=bool(int(rec["id"][1:]) % 2))
        assert {t["endpoint"] for t in rec["turns"]} == {rec["endpoint"]}  # pinned: one instance
    assert sum(d.stats()["served"] for d in doubles) == summary["turns"]


def test_aborted_turns_are_asked_again_and_conversations_stay_whole(tmp_path: Path, sglang: Any) -> None:
    d = sglang(*FAST, "--abort-rate", "0.3", "--seed", "5")
    convs = {f"a{i}": [f"abort {i}.{t}" for t in range(3)] for i in range(20)}
    write_lines(tmp_path / "p.jsonl", [sharegpt(c, u) for c, u in convs.items()])
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], max_attempts=20))
    assert rc == 0 and summary["completed"] == 20 and summary["aborted"] == d.stats()["aborted"] > 0
    for conv in iter_conversations(tmp_path / "run" / "generated"):
        check_interleaved(conv.messages, convs[conv.id])


def test_a_turn_cut_at_its_limit_ends_the_conversation_and_is_flagged(tmp_path: Path, sglang: Any) -> None:
    d = sglang(*FAST, "--log-requests")
    write_lines(tmp_path / "p.jsonl", [sharegpt("cut", ["one", "two", "three"])])
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], max_tokens=5))
    assert rc == 0 and summary["flagged"] == {"length": 1} and summary["turns"] == 1
    assert len(requests(d.url)) == 1  # the later turns are not asked
    (rec,) = read_output(tmp_path / "run" / "generated")
    assert [m["role"] for m in rec["messages"]] == ["system", "user", "assistant"]
    assert rec["finish_reason"] == rec["stopped"] == "length" and rec["unanswered_user_turns"] == 2
    (conv,) = list(iter_conversations(tmp_path / "run" / "generated"))
    assert conv.finish_reason == "length"


# --- connections -----------------------------------------------------------------------------------
# Turn 1 of "slow" is held 6 s, longer than SGLang's 5 s keep-alive. Meanwhile the four quick prompts
# leave three pooled connections idle; turn 2 of "slow" then takes the oldest idle one (aiohttp's pool
# hands out the longest-idle connection first), which the server has closed.
STALE_PROMPTS = [sharegpt("slow", ["wait for it [hold-s=6]", "and now?"]),
                 *(sharegpt(f"quick{i}", [f"quick {i}"]) for i in range(4))]


def stale_run(tmp_path: Path, sglang: Any, **generate: Any) -> tuple[Any, dict[str, Any]]:
    d = sglang("--reasoning-parser", "qwen3", "--holds", "--keep-alive-s", "5")  # SGLang's keep-alive
    write_lines(tmp_path / "p.jsonl", STALE_PROMPTS)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], concurrency=4, **generate))
    assert rc == 0
    out = tmp_path / "run" / "generated"
    assert sorted(c.id for c in iter_conversations(out)) == ["quick0", "quick1", "quick2", "quick3", "slow"]
    users = {p["id"]: [t["value"] for t in p["conversations"] if t["from"] == "human"] for p in STALE_PROMPTS}
    for rec in read_output(out):
        check_interleaved(rec["messages"], users[rec["id"]])
    (ep,) = summary["endpoints"].values()
    assert ep["downs"] == 0 and summary["requeued"] == 0 and summary["transport_errors"] == 0
    return d, ep


def test_idle_connections_are_dropped_before_the_servers_keep_alive(tmp_path: Path, sglang: Any) -> None:
    d, ep = stale_run(tmp_path, sglang)
    assert d.stats()["stale_closed"] == 0 and ep["stale_retries"] == 0


def test_a_request_on_a_connection_the_server_closed_is_sent_again_on_a_fresh_one(
        tmp_path: Path, sglang: Any) -> None:
    # a client keep-alive longer than the server's: the race is lost, and the retry saves the request
    d, ep = stale_run(tmp_path, sglang, keepalive_s=30.0)
    assert d.stats()["stale_closed"] >= 1 and ep["stale_retries"] == d.stats()["stale_closed"]
