"""Read completion records (the generator's output, sharegpt, OpenAI messages) into one form.

Input files are `.jsonl`, `.jsonl.zst` or `.json` (a list of records); a directory is read in sorted
order. Each record becomes a `Conversation`: OpenAI-style messages where an assistant message carries
its thinking in `reasoning_content` (inline `<think>...</think>` in content is split out); speakers are
read by trainer/conversation.py (one role map for prompts and completions). A record that
cannot be understood is a `DataError` naming the file and line.
"""
from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.conversation import ConversationError, content_text, read_turns, record_format

INPUT_SUFFIXES = (".jsonl", ".jsonl.zst", ".json", ".jsonl.zstd")


_PASSTHROUGH = ("tool_calls", "tool_call_id", "name")


class DataError(ValueError):
    """Input data that cannot be used; the message names the file, line and field at fault."""


@dataclasses.dataclass(slots=True)
class Conversation:
    id: str
    messages: list[dict[str, Any]]
    finish_reason: str = ""
    where: str = ""  # "file:line", for messages
    unterminated_think: bool = False  # the last assistant turn opened <think> and never closed it


DIR_SUFFIXES = (".jsonl", ".jsonl.zst", ".jsonl.zstd")


def is_completion_file(rel: str) -> bool:
    """Is `rel` (a path relative to a completions dir) a finished completion shard?

    Skips hidden and `_`-prefixed parts (the generator's `_state/` holds open shards, sidecars and
    rejects) and JSON manifests: only `*.jsonl` / `*.jsonl.zst` files are records in a directory.
    """
    parts = Path(rel).parts
    return bool(parts) and rel.endswith(DIR_SUFFIXES) and not any(p.startswith(("_", ".")) for p in parts)


def input_files(path: str | Path) -> list[Path]:
    """The completion files at `path`: the file itself, or a directory's shards (recursively), sorted."""
    p = Path(path)
    if p.is_file():
        if not p.name.endswith(INPUT_SUFFIXES):
            raise DataError(f"{p}: not a completions file (expected {', '.join(INPUT_SUFFIXES)})")
        return [p]
    if not p.is_dir():
        raise DataError(f"{p}: no such file or directory (expected completions: jsonl, jsonl.zst)")
    files = sorted(f for f in p.rglob("*") if f.is_file() and is_completion_file(str(f.relative_to(p))))
    if not files:
        raise DataError(f"{p}: no completion files ({', '.join(DIR_SUFFIXES)}) in this directory")
    return files


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.endswith((".zst", ".zstd")):
        import zstandard

        raw = path.open("rb")
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.TextIOWrapper(reader, encoding="utf-8")
    return path.open("r", encoding="utf-8")


def iter_raw(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for every record in one file; `where` is "file:line"."""
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from e
        items = data if isinstance(data, list) else [data]
        for i, rec in enumerate(items):
            yield f"{path}[{i}]", rec
        return
    with _open_text(path) as fh:
        try:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{lineno}", json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: not valid JSON: {e.msg} (column {e.colno})") from e
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text ({e.reason})") from e
        except Exception as e:  # zstd errors have no common base class worth importing here
            if isinstance(e, DataError):
                raise
            if type(e).__name__ == "ZstdError":
                raise DataError(f"{path}: corrupt zstd stream ({e})") from e
            raise


def _split_inline_think(content: str) -> tuple[str, str | None, bool]:
    """content with inline <think> -> (content, reasoning or None, unterminated)."""
    if "</think>" in content:
        head, _, tail = content.partition("</think>")
        reasoning = head.split("<think>")[-1].strip("\n")
        return tail.lstrip("\n"), reasoning, False
    stripped = content.lstrip()
    if stripped.startswith("<think>"):
        return "", stripped[len("<think>"):].lstrip("\n"), True
    return content, None, False


def normalize(rec: Any, where: str) -> Conversation:
    """One raw record (generator / OpenAI messages / sharegpt) -> `Conversation`."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    try:
        field = record_format(rec)[0]
        if not isinstance(rec[field], list) or not rec[field]:
            raise DataError(f"{where}: '{field}' must be a non-empty list")
        turns = read_turns(rec)
    except ConversationError as e:
        raise DataError(f"{where}: {e}") from None
    messages: list[dict[str, Any]] = []
    unterminated = False
    for t in turns:
        m = t.raw
        msg: dict[str, Any] = {"role": t.role, "content": t.content}
        for extra in _PASSTHROUGH:  # tool calling: the target's template renders these itself
            if m.get(extra) is not None:
                msg[extra] = m[extra]
        if t.role == "assistant":
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            if reasoning is not None:
                try:
                    msg["reasoning_content"] = content_text(reasoning, f"{t.where}: reasoning_content")
                except ConversationError as e:
                    raise DataError(f"{where}: {e}") from None
            else:
                content, inline, unterminated = _split_inline_think(t.content)
                msg["content"] = content
                if inline is not None:
                    msg["reasoning_content"] = inline
        messages.append(msg)
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant turn to train on")
    finish = rec.get("finish_reason") or ""
    if not isinstance(finish, str):
        finish = str(finish)
    rid = rec.get("id", rec.get("sample_id", where))
    conv = Conversation(id=str(rid), messages=messages, finish_reason=finish, where=where)
    last = messages[-1]
    conv.unterminated_think = unterminated or (
        last["role"] == "assistant" and finish == "length" and not last["content"].strip()
        and bool(last.get("reasoning_content", "").strip())
    )
    return conv


def iter_payloads(path: Path, max_line_bytes: int | None = None,
                  ) -> Iterator[tuple[str, str | dict[str, Any], int]]:
    """(where, raw line or record, bytes of the file consumed so far) — cheap, for the parallel reader.

    Lines are handed over undecoded so that JSON parsing happens in the worker processes. A line longer
    than `max_line_bytes` (data.max_line_bytes) is refused with its line number as soon as that many
    bytes of it are read: it is never held whole, nor parsed, nor tokenised.
    """
    if path.suffix == ".json":
        size = path.stat().st_size
        for where, rec in iter_raw(path):
            yield where, rec, size
        return
    raw = path.open("rb")
    stream: Any = raw
    if path.name.endswith((".zst", ".zstd")):
        import zstandard

        stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))
    limit = -1 if max_line_bytes is None else max_line_bytes + 1
    try:
        for lineno, line in enumerate(iter(lambda: stream.readline(limit), b""), 1):
            if limit > 0 and len(line) == limit and not line.endswith(b"\n"):
                raise DataError(f"{path}:{lineno}: a line of more than {max_line_bytes} bytes "
                                "(data.max_line_bytes); one conversation per line is far smaller: a "
                                "damaged file? Remove that line, or raise data.max_line_bytes")
            if line.strip():
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}:{lineno}: not UTF-8 text ({e.reason})") from e
                yield f"{path}:{lineno}", text, raw.tell()
    except Exception as e:
        if type(e).__name__ == "ZstdError":
            raise DataError(f"{path}: corrupt zstd stream ({e})") from e
        raise
    finally:
        stream.close()
        raw.close()


def parse_payload(where: str, payload: str | dict[str, Any]) -> Conversation:
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from e
    return normalize(payload, where)


def iter_conversations(path: str | Path) -> Iterator[Conversation]:
    for f in input_files(path):
        for where, rec in iter_raw(f):
            yield normalize(rec, where)
