"""One conversation reader, one role map: every spelling, read by generate's prompts and prepare's records."""
from __future__ import annotations

import json

import pytest

from trainer.conversation import ROLES, ConversationError, canonical_role, content_text, read_turns
from trainer.data.records import DataError, normalize
from trainer.generate.prompts import PromptError, parse_line

SPELLINGS = {
    "system": ["system", "System"],
    "user": ["user", "human", "Human", "USER"],
    "assistant": ["assistant", "gpt", "chatgpt", "model", "bing", "bard", "GPT"],
    "tool": ["tool", "function", "observation", "ipython"],
}
ALL = [(canon, spelled) for canon, names in SPELLINGS.items() for spelled in names]


def test_the_map_is_what_the_tests_spell():
    assert dict(ROLES) == {s.lower(): c for c, s in ALL}


@pytest.mark.parametrize(("canon", "spelled"), ALL)
def test_canonical_role(canon, spelled):
    assert canonical_role(spelled) == canon


def sharegpt(*turns: tuple[str, str]) -> dict:
    return {"id": "s", "conversations": [{"from": f, "value": v} for f, v in turns]}


def openai(*turns: tuple[str, str]) -> dict:
    return {"id": "o", "messages": [{"role": r, "content": c} for r, c in turns]}


@pytest.mark.parametrize("spelled", SPELLINGS["assistant"])
@pytest.mark.parametrize("fmt", [sharegpt, openai])
def test_every_assistant_spelling_is_dropped_from_prompts_and_trained_on_in_completions(spelled, fmt):
    rec = fmt(("human", "q"), (spelled, "a"))
    prompt = parse_line(json.dumps(rec), 1000)
    assert prompt.messages == ({"role": "user", "content": "q"},)
    conv = normalize(rec, "f:1")
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[1]["content"] == "a"


@pytest.mark.parametrize("spelled", SPELLINGS["user"] + SPELLINGS["system"])
@pytest.mark.parametrize("fmt", [sharegpt, openai])
def test_system_and_user_spellings_reach_both_callers(spelled, fmt):
    canon = canonical_role(spelled)
    rec = fmt((spelled, "s"), ("user", "q"), ("gpt", "a"))
    assert parse_line(json.dumps(rec), 1000).messages[0] == {"role": canon, "content": "s"}
    assert normalize(rec, "f:1").messages[0]["role"] == canon


@pytest.mark.parametrize("spelled", SPELLINGS["tool"])
@pytest.mark.parametrize("fmt", [sharegpt, openai])
def test_tool_turns_are_kept_in_completions_and_refused_as_prompts(spelled, fmt):
    rec = fmt(("user", "q"), ("assistant", "call"), (spelled, "result"), ("assistant", "a"))
    assert [m["role"] for m in normalize(rec, "f:1").messages] == ["user", "assistant", "tool", "assistant"]
    with pytest.raises(PromptError, match=rf"turn 2: unsupported (speaker|role) '{spelled}'"):
        parse_line(json.dumps(rec), 1000)


@pytest.mark.parametrize("fmt", [sharegpt, openai])
def test_an_unknown_speaker_is_refused_by_both_with_the_same_reason(fmt):
    rec = fmt(("user", "q"), ("robot", "a"))
    with pytest.raises(PromptError, match=r"\[1\]: unknown role 'robot'") as pe:
        parse_line(json.dumps(rec), 1000)
    with pytest.raises(DataError, match=r"f:1: .*\[1\]: unknown role 'robot'") as de:
        normalize(rec, "f:1")
    assert str(pe.value) in str(de.value)


def test_read_turns_keeps_the_raw_message_and_where():
    rec = {"conversations": [{"from": "gpt", "value": "a", "tool_calls": [1]},
                             {"role": "human", "value": "q"}]}
    a, q = read_turns(rec)
    assert (a.role, a.speaker, a.content, a.where, a.raw["tool_calls"]) == ("assistant", "gpt", "a",
                                                                            "conversations[0]", [1])
    assert (q.role, q.index) == ("user", 1)  # a ShareGPT turn may spell its role key the OpenAI way


@pytest.mark.parametrize(("rec", "why"), [
    ({"text": "x"}, "no 'messages' (OpenAI) or 'conversations' (ShareGPT) key; keys are ['text']"),
    ({"messages": "x"}, "messages: expected a list"),
    ({"messages": ["x"]}, "messages[0]: expected an object"),
    ({"conversations": [{"value": "x"}]}, "conversations[0]: expected an object with a 'from'"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0]: content: expected a string"),
])
def test_malformed_records(rec, why):
    with pytest.raises(ConversationError) as e:
        read_turns(rec)
    assert why in str(e.value)


def test_content_text():
    assert content_text(None, "x") == ""
    assert content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "x") == "ab"
    with pytest.raises(ConversationError, match=r"x: unsupported content part 'image_url'"):
        content_text([{"type": "image_url"}], "x")
