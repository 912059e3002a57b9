"""The one reader of conversation records (OpenAI messages and ShareGPT), with the one role map.

Both the prompts of `generate` (trainer/generate/prompts.py) and the completions of `prepare`
(trainer/data/records.py) are JSON objects holding either

  OpenAI:   {"messages": [{"role": ..., "content": ...}, ...]}
  ShareGPT: {"conversations": [{"from": ..., "value": ...}, ...]}

and both read them here, so a speaker accepted by one stage is accepted by the other. Each caller
decides what to do with the turns (generate keeps the system/user turns, prepare trains on the
assistant's) and wraps a `ConversationError` into its own error with the file and line.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# every spelling of a speaker seen in the wild (ShareGPT dumps, OpenAI, Gemini, tool calling) -> role
ROLES: Mapping[str, str] = {
    "system": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "model": "assistant",
    "bing": "assistant", "bard": "assistant",
    "tool": "tool", "function": "tool", "observation": "tool", "ipython": "tool",
}
CANONICAL_ROLES = ("system", "user", "assistant", "tool")

# (list key, role key, text key) of each format, in the order they are looked for
FORMATS = (("messages", "role", "content"), ("conversations", "from", "value"))


class ConversationError(ValueError):
    """A record whose turns cannot be read; the message names the field (``messages[2]: ...``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    index: int
    role: str  # one of CANONICAL_ROLES
    content: str  # the text (content parts joined)
    raw: Mapping[str, Any]  # the message as read (tool_calls, reasoning_content, ...)
    speaker: str  # the role as spelled in the record
    where: str  # "messages[2]", for messages


def canonical_role(speaker: str) -> str | None:
    """'gpt' -> 'assistant', 'Human' -> 'user'...; None for a speaker nobody knows."""
    return ROLES.get(speaker.strip().lower())


def content_text(value: Any, where: str) -> str:
    """A message's content as text: a string, None (""), or OpenAI content parts of type text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ConversationError(f"{where}: unsupported content part {kind!r} (only text)")
        return "".join(parts)
    raise ConversationError(f"{where}: expected a string, got {type(value).__name__}")


def record_format(rec: Mapping[str, Any]) -> tuple[str, str, str]:
    """(list key, role key, text key) of a record, or a ConversationError naming its keys."""
    for fmt in FORMATS:
        if fmt[0] in rec:
            return fmt
    raise ConversationError(f"no 'messages' (OpenAI) or 'conversations' (ShareGPT) key; "
                            f"keys are {sorted(map(str, rec))[:8]}")


def read_turns(rec: Mapping[str, Any]) -> list[Turn]:
    """The turns of one record, roles mapped by `ROLES`. A missing or unknown role, a non-object turn or
    non-text content is a ConversationError. ShareGPT turns may spell their keys the OpenAI way."""
    field, role_key, text_key = record_format(rec)
    items = rec[field]
    if not isinstance(items, list):
        raise ConversationError(f"{field}: expected a list, got {type(items).__name__}")
    turns = []
    for i, m in enumerate(items):
        at = f"{field}[{i}]"
        if not isinstance(m, dict):
            raise ConversationError(f"{at}: expected an object, got {type(m).__name__}")
        speaker = m.get(role_key, m.get("role"))
        if not isinstance(speaker, str):
            raise ConversationError(f"{at}: expected an object with a {role_key!r}, got {speaker!r:.40}")
        role = canonical_role(speaker)
        if role is None:
            raise ConversationError(f"{at}: unknown role {speaker!r} (expected {'/'.join(CANONICAL_ROLES)} "
                                    f"or one of {', '.join(sorted(set(ROLES) - set(CANONICAL_ROLES)))})")
        text = content_text(m.get(text_key, m.get("content")), f"{at}: {text_key}")
        turns.append(Turn(i, role, text, m, speaker, at))
    return turns
