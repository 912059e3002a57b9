"""Prompt files -> conversations to regenerate (original assistant turns dropped) or rejects with a reason.

A prompt keeps the system and user turns in order; each user turn is answered in turn, with the
conversation so far (trainer/generate/turns.py), so a conversation with k user turns takes k requests.

Accepted line formats (one JSON object per line, files *.jsonl or *.jsonl.zst, or a directory of them):
  OpenAI:   {"id": ..., "messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}
  ShareGPT: {"id": ..., "conversations": [{"from": "system"|"human"|"gpt", "value": ...}, ...]}
Speakers are read by trainer/conversation.py (one role map for prompts and completions).
The sample id is the line's "id" (or "conversation_id"); without one it is a digest of the kept turns,
so it is stable across restarts. A line is rejected (never sent) when it is not JSON, has no user turn,
has an unsupported role or content, is longer than `max_prompt_chars`, repeats an earlier id, or is not
UTF-8 (a Latin-1 file, say: its text is never sent with U+FFFD in place of what the bytes meant;
`prepare` refuses the same bytes, trainer/data/records.py).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.conversation import ConversationError, Turn, read_turns

KEPT_ROLES = ("system", "user")
SUFFIXES = (".jsonl", ".jsonl.zst", ".json", ".ndjson")


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    messages: tuple[dict[str, str], ...]  # system/user turns only, in order; each user turn is asked
    chars: int


@dataclasses.dataclass(frozen=True, slots=True)
class Reject:
    source: str
    line: int
    reason: str
    id: str | None = None
    excerpt: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class PromptError(ValueError):
    """A prompt line that cannot be used; the message is the reject reason, `id` the line's id when it
    could be read."""

    def __init__(self, reason: str, sample_id: str | None = None) -> None:
        super().__init__(reason)
        self.id = sample_id


def prompt_files(path: Path) -> list[Path]:
    """The prompt files at `path` (a file, or a directory of *.jsonl / *.jsonl.zst, sorted)."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))
        if not files:
            raise FileNotFoundError(f"{path}: no *.jsonl or *.jsonl.zst prompt files in this directory")
        return files
    if not path.is_file():
        raise FileNotFoundError(f"{path}: prompt file not found")
    return [path]


def open_lines(path: Path) -> io.BufferedIOBase:
    """The file's bytes, line by line (each line is decoded on its own, so a bad one is named)."""
    if path.name.endswith(".zst"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
        return io.BufferedReader(raw)  # type: ignore[arg-type]
    return path.open("rb")


def _turns(obj: dict[str, Any]) -> list[Turn]:
    try:
        return read_turns(obj)
    except ConversationError as e:
        raise PromptError(str(e)) from None


def parse_line(line: str, max_chars: int) -> Prompt:
    """One prompt line -> Prompt, or PromptError with the reason."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise PromptError(f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise PromptError(f"expected a JSON object, got {type(obj).__name__}")
    raw_id = obj.get("id", obj.get("conversation_id"))
    readable = str(raw_id) if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else None
    try:
        return _parse_object(obj, raw_id, max_chars)
    except PromptError as e:
        e.id = e.id or (readable or None)  # a reject names the sample whenever its id is readable
        raise


def _parse_object(obj: dict[str, Any], raw_id: Any, max_chars: int) -> Prompt:
    kept = []
    for t in _turns(obj):
        if t.role == "assistant":
            continue  # the original completion: regenerated
        if t.role not in KEPT_ROLES:
            kind = "speaker" if t.where.startswith("conversations") else "role"
            also = f" (a {t.role} turn)" if t.speaker != t.role else ""
            raise PromptError(f"turn {t.index}: unsupported {kind} {t.speaker!r}{also}; a prompt keeps "
                              f"{'/'.join(KEPT_ROLES)} turns")
        kept.append({"role": t.role, "content": t.content})
    while kept and kept[-1]["role"] != "user":  # nothing to answer after the last user turn
        kept.pop()
    if not any(m["role"] == "user" and m["content"].strip() for m in kept):
        raise PromptError("no user turn with content")
    chars = sum(len(m["content"]) for m in kept)
    if chars > max_chars:
        raise PromptError(f"over-long: {chars} characters > generate.max_prompt_chars {max_chars}")
    if raw_id is None or raw_id == "":
        digest = json.dumps([[m["role"], m["content"]] for m in kept], ensure_ascii=False)
        sample_id = "sha-" + hashlib.sha256(digest.encode()).hexdigest()[:20]
    elif isinstance(raw_id, str | int) and not isinstance(raw_id, bool):
        sample_id = str(raw_id)
    else:
        raise PromptError(f"id must be a string or an integer, got {type(raw_id).__name__}")
    return Prompt(sample_id, tuple(kept), chars)


def _lines(fh: io.BufferedIOBase, max_line_bytes: int | None) -> Iterator[tuple[bytes, bool]]:
    """(line, whole) for each line of `fh`; a line longer than `max_line_bytes` comes as its first bytes
    with whole=False, the rest read in pieces and dropped, so it is never held whole."""
    if max_line_bytes is None:
        for line in fh:
            yield line, True
        return
    limit = max_line_bytes + 1
    while line := fh.readline(limit):
        if len(line) < limit or line.endswith(b"\n"):
            yield line, True
            continue
        head = line[:200]
        while (rest := fh.readline(limit)) and not rest.endswith(b"\n"):
            pass
        yield head, False


def read_prompts(files: list[Path], max_chars: int,
                 max_line_bytes: int | None = None) -> Iterator[Prompt | Reject]:
    """Every prompt of `files` in order, or a Reject for each unusable line (blank lines are skipped); a
    line longer than `max_line_bytes` (data.max_line_bytes) is rejected unread, with its line number."""
    first_seen: dict[str, str] = {}
    for path in files:
        with open_lines(path) as fh:
            for lineno, (raw, whole) in enumerate(_lines(fh, max_line_bytes), 1):
                if not whole:
                    yield Reject(str(path), lineno, f"a line of more than {max_line_bytes} bytes "
                                 "(data.max_line_bytes): not read", None,
                                 raw.decode("utf-8", errors="backslashreplace"))
                    continue
                if not raw.strip():
                    continue
                where = f"{path.name}:{lineno}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield Reject(str(path), lineno, f"not UTF-8 text ({e.reason} at byte {e.start} of the "
                                 "line)", None, raw[:200].decode("utf-8", errors="backslashreplace"))
                    continue
                try:
                    p = parse_line(line, max_chars)
                except PromptError as e:
                    yield Reject(str(path), lineno, str(e), e.id, line[:200])
                    continue
                if p.id in first_seen:
                    yield Reject(str(path), lineno, f"duplicate id {p.id!r} (first at {first_seen[p.id]})",
                                 p.id, line[:200])
                    continue
                first_seen[p.id] = where
                yield p


def count_lines(files: list[Path]) -> int:
    """Non-blank lines of `files` (for the ETA)."""
    n = 0
    for path in files:
        with open_lines(path) as fh:
            n += sum(1 for line in fh if line.strip())
    return n


def reject_kind(reason: str) -> str:
    """A reject's reason without its particulars ('not JSON: Expecting value: line 1 ...' -> 'not JSON')."""
    head = re.split(r"[:(]", reason, maxsplit=1)[0]
    return re.sub(r"'[^']*'|\b\d+\b", "…", head).strip() or reason[:60]


def rejects_line(kinds: collections.Counter[str], examples: list[str]) -> str:
    """One console line: rejects counted by reason, and the first few."""
    counts = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return f"{counts}; first: {', '.join(examples)}" if examples else counts
