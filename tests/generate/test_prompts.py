"""Prompt parsing: formats, dropped assistant turns, stable ids and the reject reasons."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from trainer.generate.prompts import (
    Prompt,
    PromptError,
    Reject,
    count_lines,
    parse_line,
    prompt_files,
    read_prompts,
)


def test_openai_messages_drop_assistant_turns_and_keep_order() -> None:
    line = json.dumps({"id": 7, "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"}]})
    p = parse_line(line, 1000)
    assert p.id == "7"
    assert p.messages == ({"role": "system", "content": "sys"}, {"role": "user", "content": "u1"},
                          {"role": "user", "content": "u2"})
    assert p.chars == len("sysu1u2")


def test_sharegpt_roles_are_mapped() -> None:
    line = json.dumps({"id": "a", "conversations": [
        {"from": "system", "value": "s"}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}]})
    kept = ({"role": "system", "content": "s"}, {"role": "user", "content": "hi"})
    assert parse_line(line, 100).messages == kept


def test_text_content_parts_are_joined() -> None:
    line = json.dumps({"id": "p", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert parse_line(line, 100).messages[0]["content"] == "ab"


def test_id_without_id_field_is_a_stable_digest_of_the_kept_turns() -> None:
    q = {"role": "user", "content": "q"}
    a = parse_line(json.dumps({"messages": [q, {"role": "assistant", "content": "1"}]}), 99)
    b = parse_line(json.dumps({"messages": [q, {"role": "assistant", "content": "2"}]}), 99)
    c = parse_line(json.dumps({"messages": [{"role": "user", "content": "other"}]}), 99)
    assert a.id == b.id and a.id.startswith("sha-")
    assert c.id != a.id


@pytest.mark.parametrize(("line", "reason"), [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"id": 1, "text": "hi"}), "no 'messages' (OpenAI) or 'conversations'"),
    (json.dumps({"id": 1, "messages": [{"role": "system", "content": "s"}]}), "no user turn"),
    (json.dumps({"id": 1, "messages": [{"role": "user", "content": "   "}]}), "no user turn"),
    (json.dumps({"id": 1, "messages": [{"role": "user", "content": "x" * 101}]}),
     "over-long: 101 characters"),
    (json.dumps({"id": 1, "messages": [{"role": "tool", "content": "t"}, {"role": "user", "content": "q"}]}),
     "unsupported role 'tool'"),
    (json.dumps({"id": 1, "conversations": [{"from": "observation", "value": "x"}]}), "unsupported speaker"),
    (json.dumps({"id": 1, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
     "unsupported content part 'image_url'"),
    (json.dumps({"id": [1], "messages": [{"role": "user", "content": "q"}]}), "id must be a string"),
])
def test_bad_lines_raise_with_the_reason(line: str, reason: str) -> None:
    with pytest.raises(PromptError) as e:
        parse_line(line, 100)
    assert reason in str(e.value)


def test_read_prompts_yields_rejects_with_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join([
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "q"}]}),
        "",
        "garbage",
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "again"}]}),
        json.dumps({"id": "b", "conversations": [{"from": "human", "value": "q"}]}),
    ]) + "\n")
    items = list(read_prompts([f], 100))
    assert [type(i) for i in items] == [Prompt, Reject, Reject, Prompt]
    assert items[1].line == 3 and "invalid JSON" in items[1].reason and items[1].source == str(f)
    assert items[2].line == 4 and items[2].reason == "duplicate id 'a' (first at p.jsonl:1)"
    assert count_lines([f]) == 4


def test_zst_files_and_directories(tmp_path: Path) -> None:
    d = tmp_path / "prompts"
    d.mkdir()
    data = "".join(json.dumps({"id": i, "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                   for i in range(5))
    (d / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data.encode()))
    (d / "a.jsonl").write_text(json.dumps({"id": "x", "messages": [{"role": "user", "content": "q"}]}) + "\n")
    (d / "notes.txt").write_text("ignored")
    files = prompt_files(d)
    assert [f.name for f in files] == ["a.jsonl", "b.jsonl.zst"]
    assert [p.id for p in read_prompts(files, 100)] == ["x", "0", "1", "2", "3", "4"]


def test_missing_prompts_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        prompt_files(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match=r"no \*\.jsonl"):
        prompt_files(tmp_path)


def test_rejects_of_json_lines_keep_their_id(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join([
        json.dumps({"id": "nouser", "messages": [{"role": "system", "content": "s"}]}),
        json.dumps({"conversation_id": 17, "conversations": [{"from": "observation", "value": "x"}]}),
        json.dumps({"id": ["not", "readable"], "messages": [{"role": "user", "content": "q"}]}),
        '{"id": "cut", "messages": [',
    ]) + "\n")
    rejects = list(read_prompts([f], 100))
    assert [r.id for r in rejects] == ["nouser", "17", None, None]
    assert all(isinstance(r, Reject) for r in rejects)
    assert "no user turn" in rejects[0].reason and "unsupported speaker" in rejects[1].reason


@pytest.mark.parametrize("name", ["p.jsonl", "p.jsonl.zst"])
def test_a_line_that_is_not_utf8_is_rejected_with_file_and_line_never_sent_as_replacement(
        tmp_path: Path, name: str) -> None:
    """A Latin-1 prompt ("café" as the byte 0xE9) is refused, as prepare refuses it
    (trainer/data/records.py), not decoded to U+FFFD and sent to the model."""
    good = json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}).encode()
    latin1 = '{"id": "b", "messages": [{"role": "user", "content": "caf\u00e9"}]}'.encode("latin-1")
    data = good + b"\n" + latin1 + b"\n" + good.replace(b'"a"', b'"c"') + b"\n"
    path = tmp_path / name
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if name.endswith(".zst") else data)
    out = list(read_prompts([path], 1000))
    assert [p.id for p in out if isinstance(p, Prompt)] == ["a", "c"]
    (rej,) = [r for r in out if isinstance(r, Reject)]
    assert (rej.source, rej.line) == (str(path), 2)
    at = latin1.index(b"\xe9")
    assert rej.reason == f"not UTF-8 text (invalid continuation byte at byte {at} of the line)"
    assert rej.excerpt.rstrip() == '{"id": "b", "messages": [{"role": "user", "content": "caf\\xe9"}]}'
    assert count_lines([path]) == 3


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_a_line_over_max_line_bytes_is_rejected_unread_and_the_next_lines_go_on(tmp_path: Path,
                                                                                  suffix: str) -> None:
    big = json.dumps({"id": "big", "messages": [{"role": "user", "content": "x" * 5000}]})
    text = "\n".join([json.dumps({"id": "a", "messages": [{"role": "user", "content": "q"}]}), big,
                      json.dumps({"id": "b", "messages": [{"role": "user", "content": "r"}]})]) + "\n"
    f = tmp_path / f"p{suffix}"
    f.write_bytes(zstandard.ZstdCompressor().compress(text.encode()) if suffix.endswith(".zst")
                  else text.encode())
    items = list(read_prompts([f], 10_000, max_line_bytes=1024))
    assert [type(i) for i in items] == [Prompt, Reject, Prompt]
    assert [i.id for i in items if isinstance(i, Prompt)] == ["a", "b"]
    assert items[1].line == 2
    assert items[1].reason == "a line of more than 1024 bytes (data.max_line_bytes): not read"
    # without the limit the same line is read (and kept: it is under max_chars)
    assert [type(i) for i in read_prompts([f], 10_000)] == [Prompt, Prompt, Prompt]
    # a line of exactly the limit, with its newline, is whole
    exact = json.dumps({"id": "e", "messages": [{"role": "user", "content": "y"}]})
    exact = exact[:-3] + " " * (1024 - len(exact) - 1) + exact[-3:]
    g = tmp_path / "exact.jsonl"
    g.write_text(exact + "\n")
    assert len((exact + "\n").encode()) == 1024
    assert [type(i) for i in read_prompts([g], 10_000, max_line_bytes=1024)] == [Prompt]
