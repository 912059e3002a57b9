"""The token budget (generate.budget_tokens): each request asks only for what the training length leaves
after its prompt, counted with the target's tokenizer and chat template (here the tiny Qwen-style
tokenizer the lab's target uses), against the SGLang double's request log."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from genhelpers import read_output, write_run
from test_run import run_stage
from test_turns import FAST, requests, sharegpt, write_lines

from trainer.config import ConfigError, load_run_config
from trainer.generate.stage import stage


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.data.tiny_tokenizer import build_tiny_tokenizer

    out = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tiny_tokenizer(out)
    return out


def count(tok_dir: Path, messages: list[dict[str, Any]]) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, enable_thinking=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_each_request_asks_for_the_remainder_of_the_training_length(tmp_path: Path, sglang: Any,
                                                                     tok_dir: Path) -> None:
    d = sglang(*FAST, "--log-requests")
    write_lines(tmp_path / "p.jsonl", [sharegpt("two", ["first question about primes", "and a second"])])
    budget, cap = 300, 512  # the prompt plus max_tokens would exceed the training length
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], max_tokens=cap,
                                      budget_tokens=budget, budget_min_tokens=16, tokenizer=str(tok_dir)))
    assert rc == 0 and summary["completed"] == 1
    asked = requests(d.url)
    assert len(asked) == 2
    for req in asked:
        n = count(tok_dir, req["messages"])
        assert req["max_tokens"] == budget - n < cap, (n, req["max_tokens"])
    assert asked[1]["max_tokens"] < asked[0]["max_tokens"]  # turn 2's prompt holds turn 1's answer


def test_the_cap_still_applies_when_the_budget_leaves_more(tmp_path: Path, sglang: Any,
                                                           tok_dir: Path) -> None:
    d = sglang(*FAST, "--log-requests")
    write_lines(tmp_path / "p.jsonl", [sharegpt("one", ["hello"])])
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], max_tokens=40, budget_tokens=4096,
                                budget_min_tokens=16, tokenizer=str(tok_dir)))
    assert rc == 0 and [r["max_tokens"] for r in requests(d.url)] == [40]


def test_a_prompt_that_leaves_too_little_is_skipped_with_the_reason(tmp_path: Path, sglang: Any,
                                                                    tok_dir: Path) -> None:
    d = sglang(*FAST, "--log-requests")
    long_user = " ".join(["primes"] * 400)
    write_lines(tmp_path / "p.jsonl", [sharegpt("fits", ["short"]), sharegpt("long", [long_user])])
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], budget_tokens=300,
                                      budget_min_tokens=64, tokenizer=str(tok_dir)))
    assert rc == 0 and summary["completed"] == 1 and summary["skipped_budget"] == 1
    assert summary["rejected"] == 0  # not a reject of the input
    assert [r["id"] for r in read_output(tmp_path / "run" / "generated")] == ["fits"]
    assert len(requests(d.url)) == 1  # never sent
    state = tmp_path / "run" / "generated" / "_state"
    (skip,) = [json.loads(x) for x in (state / "skipped.ndjson").read_text().splitlines()]
    assert skip["id"] == "long"
    assert skip["reason"] == (f"budget: the first turn's prompt is {skip['prompt_tokens']} tokens, "
                              f"{skip['prompt_tokens'] - 300} over generate.budget_tokens 300: no room "
                              "for an answer")
    assert skip["prompt_tokens"] == count(tok_dir, [{"role": "system", "content": "be brief"},
                                                    {"role": "user", "content": long_user}])
    assert (state / "rejects.ndjson").read_text() == ""


def test_a_later_turn_without_room_ends_the_conversation_with_the_turns_it_has(
        tmp_path: Path, sglang: Any, tok_dir: Path) -> None:
    d = sglang(*FAST, "--log-requests")
    write_lines(tmp_path / "p.jsonl", [sharegpt("room", ["hi", " ".join(["primes"] * 200)])])
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], budget_tokens=260,
                                      budget_min_tokens=64, tokenizer=str(tok_dir)))
    assert rc == 0 and summary["completed"] == 1 and len(requests(d.url)) == 1
    (rec,) = read_output(tmp_path / "run" / "generated")
    assert [m["role"] for m in rec["messages"]] == ["system", "user", "assistant"]
    assert rec["stopped"] == "budget" and rec["unanswered_user_turns"] == 1


def test_budget_settings_are_checked_with_the_key_named(tmp_path: Path) -> None:
    write_lines(tmp_path / "p.jsonl", [sharegpt("x", ["q"])])
    nowhere = ["http://127.0.0.1:1"]
    with pytest.raises(ConfigError, match=r"budget_tokens \(100\) must exceed budget_min_tokens"):
        load_run_config(write_run(tmp_path, tmp_path / "p.jsonl", nowhere, budget_tokens=100,
                                  budget_min_tokens=128))
    cfg = load_run_config(write_run(tmp_path, tmp_path / "p.jsonl", nowhere, budget_tokens=4096,
                                    tokenizer=str(tmp_path / "no-tokenizer")))
    with pytest.raises(ConfigError, match=r"generate\.budget_tokens: tokenizer .*no-tokenizer does not"):
        stage(cfg)


@pytest.mark.parametrize(("prompt_tokens", "reason"), [
    (500, "budget: the first turn's prompt is 500 tokens, 200 over generate.budget_tokens 300: no room for "
          "an answer"),
    (300, "budget: the first turn's prompt is 300 tokens, 0 over generate.budget_tokens 300: no room for "
          "an answer"),
    (250, "budget: the first turn's prompt is 250 tokens, leaving 50 of generate.budget_tokens 300 "
          "(< generate.budget_min_tokens 64)"),
])
def test_the_skip_reason_says_what_is_left_or_by_how_much_the_prompt_is_over(prompt_tokens: int,
                                                                            reason: str) -> None:
    from trainer.generate.prompts import Prompt
    from trainer.generate.turns import Budget, skip_line

    budget = Budget(0, 64, "", True)
    budget.total = 300
    line = json.loads(skip_line(Prompt("p", ({"role": "user", "content": "x"},), 1), prompt_tokens, budget))
    assert line == {"id": "p", "reason": reason, "prompt_tokens": prompt_tokens}
