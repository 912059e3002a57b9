"""Loss mask and multi-turn expansion, checked against an independent count from the chat template.

The supervised tokens of a row are exactly the tokens after the generation prompt
(`apply_chat_template(messages[:-1], add_generation_prompt=True)`): that is how the target saw them when
it generated the response, so it is the reference the mask must match.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from data_factory import healthy, record, write_jsonl

from trainer.data.records import DataError, iter_conversations, normalize
from trainer.data.render import expand

MULTI = {
    "id": "m1",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two plus two is four"},
        {"role": "user", "content": "And times 3?"},
        {"role": "assistant", "content": "12", "reasoning_content": "four times three"},
        {"role": "user", "content": "Minus 5?"},
        {"role": "assistant", "content": "7", "reasoning_content": "twelve minus five"},
    ],
    "finish_reason": "stop",
}


def _prompt_len(tok: Any, messages: list[dict[str, Any]]) -> int:
    prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True,
                                     enable_thinking=True)
    return len(tok(prompt, add_special_tokens=False)["input_ids"])


def test_mask_starts_at_the_assistant_turn_covers_think_and_ends_with_im_end(tiny_tok: Any) -> None:
    conv = normalize(record(1, "The answer is 2.", "one plus one"), "x:1")
    (row,) = expand(conv, tiny_tok, 4096)
    toks = tiny_tok.convert_ids_to_tokens(row.input_ids)
    first = row.loss_mask.index(1)
    assert tiny_tok.decode(row.input_ids[:first]).endswith("<|im_start|>assistant\n")
    assert toks[first] == "<think>"
    assert "</think>" in toks[first:]
    assert toks[-1] == "<|im_end|>" and row.loss_mask[-1] == 1
    assert row.loss_mask == [0] * first + [1] * (len(toks) - first)  # one contiguous span
    supervised = tiny_tok.decode([i for i, m in zip(row.input_ids, row.loss_mask, strict=True) if m])
    assert supervised == "<think>\none plus one\n</think>\n\nThe answer is 2.<|im_end|>"


def test_mask_sum_equals_the_supervised_token_count(tiny_tok: Any) -> None:
    conv = normalize(record(7, "It is 14.", "seven and seven make fourteen " * 5), "x:1")
    (row,) = expand(conv, tiny_tok, 4096)
    msgs = conv.messages
    assert sum(row.loss_mask) == row.n_supervised == len(row.input_ids) - _prompt_len(tiny_tok, msgs)
    assert row.longest_run == row.n_supervised


def test_multi_turn_expansion_one_row_per_assistant_turn(tiny_tok: Any) -> None:
    conv = normalize(MULTI, "x:1")
    rows = expand(conv, tiny_tok, 4096)
    assert [r.turn for r in rows] == [0, 1, 2]
    answers = ["4", "12", "7"]
    reasonings = ["two plus two is four", "four times three", "twelve minus five"]
    assistant_at = [2, 4, 6]
    for j, row in enumerate(rows):
        text = tiny_tok.decode(row.input_ids)
        sup = tiny_tok.decode([i for i, m in zip(row.input_ids, row.loss_mask, strict=True) if m])
        assert sup == f"<think>\n{reasonings[j]}\n</think>\n\n{answers[j]}<|im_end|>"
        for earlier in reasonings[:j]:  # earlier turns appear as the template shows them: no reasoning
            assert earlier not in text
        msgs = MULTI["messages"][: assistant_at[j] + 1]
        assert row.n_supervised == len(row.input_ids) - _prompt_len(tiny_tok, msgs)


def test_sharegpt_and_inline_think_give_the_same_rows(tiny_tok: Any) -> None:
    openai = normalize(record(3, "Six.", "three twice"), "a:1")
    sharegpt = normalize({"id": "s3", "conversations": [
        {"from": "system", "value": "You are helpful."},
        {"from": "human", "value": "Question number 3: what is 3 + 3?"},
        {"from": "gpt", "value": "<think>\nthree twice\n</think>\n\nSix."},
    ]}, "b:1")
    a, b = expand(openai, tiny_tok, 4096)[0], expand(sharegpt, tiny_tok, 4096)[0]
    assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask


def test_generation_cut_at_its_limit_is_not_closed(tiny_tok: Any) -> None:
    conv = normalize(record(2, "", "thinking that never ends", finish="length"), "x:1")
    (row,) = expand(conv, tiny_tok, 4096)
    assert row.unterminated_think and row.gen_truncated
    sup = tiny_tok.decode([i for i, m in zip(row.input_ids, row.loss_mask, strict=True) if m])
    assert sup == "<think>\nthinking that never ends"  # no made-up </think> or <|im_end|>


def test_truncation_to_max_length(tiny_tok: Any) -> None:
    conv = normalize(record(4, "x " * 300, "y " * 300), "x:1")
    (row,) = expand(conv, tiny_tok, 64)
    assert len(row.input_ids) == len(row.loss_mask) == 64 and row.truncated
    assert row.loss_mask[-1] == 1


def test_empty_response_is_only_template_tokens(tiny_tok: Any) -> None:
    (row,) = expand(normalize(record(5, "", ""), "x:1"), tiny_tok, 4096)
    assert row.empty_response
    sup = tiny_tok.decode([i for i, m in zip(row.input_ids, row.loss_mask, strict=True) if m])
    assert sup == "<think>\n\n</think>\n\n<|im_end|>"


@pytest.mark.parametrize(("line", "needle"), [
    ('{"id": 1, "messages": [', "bad.jsonl:2: not valid JSON"),
    ('{"id": 1, "prompt": "x"}', "no 'messages'"),
    ('{"id": 1, "messages": [{"role": "robot", "content": "x"}]}', "messages[0]: unknown role 'robot'"),
    ('{"id": 1, "messages": [{"role": "user", "content": "x"}]}', "no assistant turn"),
    ('{"id": 1, "messages": [{"role": "assistant", "content": 3}]}',
     "messages[0]: content: expected a string"),
])
def test_bad_records_name_the_file_and_line(tmp_path: Path, line: str, needle: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": 0, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", '
                 '"content": "a"}]}\n' + line + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:2") as exc:
        list(iter_conversations(f))
    assert needle in str(exc.value)


def test_reads_jsonl_zst_and_directories(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a" / "part-0.jsonl.zst", [healthy(i) for i in range(3)], zst=True)
    write_jsonl(tmp_path / "a" / "part-1.jsonl", [healthy(i) for i in range(3, 5)])
    ids = [c.id for c in iter_conversations(tmp_path / "a")]
    assert ids == ["s0", "s1", "s2", "s3", "s4"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: no completion files"):
        list(iter_conversations(tmp_path / "empty"))
    with pytest.raises(DataError, match="nothing: no such file or directory"):
        list(iter_conversations(tmp_path / "nothing"))


def test_tool_call_turns_keep_their_calls_and_are_not_empty(tiny_tok: Any) -> None:
    call = [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]
    conv = normalize({"id": "t", "messages": [
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": "", "reasoning_content": "use the tool", "tool_calls": call},
    ]}, "x:1")
    assert conv.messages[-1]["tool_calls"] == call  # handed to the target's template untouched
    (row,) = expand(conv, tiny_tok, 4096)
    assert not row.empty_response and row.answer_chars > 0
