"""Record builders for the data-pipeline tests (records as the generator writes them)."""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def record(
    i: int, answer: str, reasoning: str, *, finish: str = "stop", question: str = "",
) -> dict[str, Any]:
    """A record as the generator writes it."""
    return {
        "id": f"s{i}",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": question or f"Question number {i}: what is {i} + {i}?"},
            {"role": "assistant", "content": answer, "reasoning_content": reasoning},
        ],
        "finish_reason": finish, "endpoint": "http://127.0.0.1:30000", "usage": {"completion_tokens": 9},
    }


def healthy(i: int) -> dict[str, Any]:
    reasoning = f"Let me think step by step about {i}. " + "We add the numbers carefully. " * (1 + i % 7)
    return record(i, f"The answer is {2 * i}.", reasoning)


def write_jsonl(path: Path, records: Iterable[dict[str, Any]], zst: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if zst:
        import zstandard

        text = zstandard.ZstdCompressor().compress(text)
    path.write_bytes(text)
    return path
