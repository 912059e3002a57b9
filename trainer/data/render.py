"""Chat-template rendering, tokenisation and the loss mask.

A conversation with k assistant turns becomes k rows (multi-turn expansion): row j is the conversation
up to and including assistant turn j, rendered with the target tokenizer's own chat template (thinking
on), so earlier turns look exactly as the template shows them at inference (Qwen drops their
reasoning). Only the last assistant turn of a row is supervised: from the first token after
`<|im_start|>assistant\\n` (so `<think>` is included) through `<|im_end|>`. A completion cut by the
generator (finish_reason "length") keeps its text as generated: no `</think>` or `<|im_end|>` is made up.

Nothing here assumes more of the tokenizer than the special-token strings: the span is found in the
rendered text and mapped to tokens with the fast tokenizer's offset mapping.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from trainer.data.records import Conversation, DataError
from trainer.data.split import split_key

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ASSISTANT_HEADER = IM_START + "assistant"


@dataclasses.dataclass(slots=True)
class Row:
    """One training row plus the per-sample facts the doctor reads."""

    id: str
    turn: int
    input_ids: list[int]
    loss_mask: list[int]
    n_supervised: int
    longest_run: int  # longest run of consecutive supervised tokens (anchors need >= 2)
    answer_chars: int
    reasoning_chars: int
    finish_reason: str
    unterminated_think: bool
    gen_truncated: bool  # the generator stopped at its token limit
    truncated: bool  # cut here at max_length
    response_hash: str
    split_key: str  # what the held-out split hashes: the conversation's normalized first user turn

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def empty_response(self) -> bool:
        return self.answer_chars == 0 and self.reasoning_chars == 0


def supervised_span(text: str, cut_after: str = "") -> tuple[int, int]:
    """(start, end) character span of the last assistant turn in rendered `text`.

    start is just after `<|im_start|>assistant\\n`; end is just after the following `<|im_end|>`, or
    just after the last occurrence of `cut_after` (a truncated generation's last text) when given.
    """
    head = text.rfind(ASSISTANT_HEADER)
    if head < 0:
        raise DataError(f"the chat template rendered no '{ASSISTANT_HEADER}' header")
    nl = text.find("\n", head + len(ASSISTANT_HEADER))
    start = len(text) if nl < 0 else nl + 1
    if cut_after:
        pos = text.rfind(cut_after, start)
        if pos >= 0:
            return start, pos + len(cut_after)
    end = text.find(IM_END, start)
    return start, (len(text) if end < 0 else end + len(IM_END))


def _longest_run(mask: list[int]) -> int:
    return max(map(len, bytes(mask).split(b"\x00")), default=0)


def render_row(
    tokenizer: Any, messages: list[dict[str, Any]], *, truncated_generation: bool = False,
    max_length: int = 0, chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], list[int], bool]:
    """Render `messages` (ending with an assistant turn) -> (input_ids, loss_mask, truncated_here)."""
    kwargs = {"enable_thinking": True, **(chat_template_kwargs or {})}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, **kwargs)
    if not isinstance(text, str):
        raise DataError(f"apply_chat_template returned {type(text).__name__}, expected text")
    cut_after = ""
    if truncated_generation:
        last = messages[-1]
        cut_after = last["content"].rstrip() or last.get("reasoning_content", "").strip("\n").rstrip()
    start, end = supervised_span(text, cut_after)
    text = text[:end]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = enc["offset_mapping"]
    # the supervised tokens overlap [start, end): one contiguous run (offsets are monotonic)
    first = next((i for i in range(len(offsets)) if offsets[i][1] > start), len(offsets))
    mask = [0] * first + [1] * (len(offsets) - first)  # text ends at `end`: every later token overlaps
    cut = bool(max_length) and len(ids) > max_length
    if cut:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask, cut


def _hash(reasoning: str, answer: str) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(reasoning.strip().encode())
    h.update(b"\x00")
    h.update(answer.strip().encode())
    return h.hexdigest()


def expand(conv: Conversation, tokenizer: Any, max_length: int,
           chat_template_kwargs: dict[str, Any] | None = None) -> list[Row]:
    """One row per assistant turn of `conv` (multi-turn expansion), each supervising its last turn."""
    rows: list[Row] = []
    key = split_key(conv.messages, conv.id)
    assistant_idx = [i for i, m in enumerate(conv.messages) if m["role"] == "assistant"]
    for turn, k in enumerate(assistant_idx):
        msgs = conv.messages[: k + 1]
        last = msgs[-1]
        is_final = k == assistant_idx[-1] and k == len(conv.messages) - 1
        gen_truncated = is_final and conv.finish_reason == "length"
        try:
            ids, mask, cut = render_row(tokenizer, msgs, truncated_generation=gen_truncated,
                                        max_length=max_length, chat_template_kwargs=chat_template_kwargs)
        except DataError as e:
            raise DataError(f"{conv.where}: {e}") from e
        except Exception as e:  # template errors come from jinja with no file context
            raise DataError(f"{conv.where}: cannot render turn {turn} with the chat template: {e}") from e
        reasoning = last.get("reasoning_content", "") or ""
        answer = last["content"].strip() + (json.dumps(last["tool_calls"]) if last.get("tool_calls") else "")
        rows.append(Row(
            id=conv.id, turn=turn, input_ids=ids, loss_mask=mask, n_supervised=sum(mask),
            longest_run=_longest_run(mask), answer_chars=len(answer),
            reasoning_chars=len(reasoning.strip()), finish_reason=conv.finish_reason if is_final else "stop",
            unterminated_think=is_final and conv.unterminated_think, gen_truncated=gen_truncated,
            truncated=cut, response_hash=_hash(reasoning, answer), split_key=key,
        ))
    return rows
