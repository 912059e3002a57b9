"""A conversation regenerated turn by turn, and the token budget of each of its requests.

A prompt keeps its system and user turns in order (trainer/generate/prompts.py). It is answered the way
it will be served: the first request holds the turns up to the first user turn, its answer is appended
(content and reasoning_content apart, as SGLang returns them), then the next user turn, and so on; a
conversation with k user turns takes k requests, each holding the conversation so far. Only the whole
conversation becomes a record, so a run killed between two turns redoes that conversation and nothing
else. A turn cut at its token limit (finish_reason "length") ends the conversation there: the record
keeps the turns before it and the cut answer, and says how many user turns were left unanswered.

Token budget (`generate.budget_tokens`, the training length): the data stage renders row j of a
conversation as everything up to answer j and cuts it at data.max_length, so decode past
`budget_tokens - tokens(conversation so far)` is never read. Each request asks for that remainder,
capped by its `max_tokens`; the prompt is counted with the target's tokenizer and chat template, as
SGLang counts it. When fewer than `generate.budget_min_tokens` would remain, a first turn is not sent
(the conversation is skipped and listed with the reason) and a later one is not asked (the conversation
ends with the turns it has).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trainer.generate.prompts import Prompt


@dataclasses.dataclass(slots=True)
class Work:
    """One conversation on its way: the answers so far, the endpoint that served them (pinned, so
    SGLang's prefix cache holds the earlier turns) and the attempts of the turn being asked."""

    prompt: Prompt
    max_tokens: int  # the cap of the next request (the retry budget after a flagged turn)
    attempts: int = 0
    retried_flagged: bool = False
    last_error: str = ""
    answers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # finish_reason, usage, endpoint
    pinned: Any = None  # the Endpoint of the earlier turns

    @property
    def user_turns(self) -> int:
        return sum(1 for m in self.prompt.messages if m["role"] == "user")

    def so_far(self) -> list[dict[str, Any]]:
        """The conversation up to the user turn to ask next, with the answers given so far."""
        return self._interleave(ask_next=True)

    def answered(self, answer: dict[str, Any], turn: dict[str, Any]) -> None:
        self.answers.append(answer)
        self.turns.append(turn)
        self.attempts = 0
        self.retried_flagged = False
        self.last_error = ""

    def done(self) -> bool:
        """Every user turn answered, or the last answer cut at its limit."""
        cut = bool(self.turns) and self.turns[-1]["finish_reason"] == "length"
        return cut or len(self.answers) >= self.user_turns

    def record(self, stopped: str = "") -> dict[str, Any]:
        """The record the data stage reads (trainer/data/records.py): id, messages, finish_reason of the
        last answer, usage summed over the turns, plus each turn's finish_reason, usage and endpoint."""
        usage = {k: sum(int(t["usage"].get(k) or 0) for t in self.turns)
                 for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        last = self.turns[-1]
        rec = {"id": self.prompt.id, "messages": self._messages(), "endpoint": last["endpoint"],
               "finish_reason": last["finish_reason"], "usage": usage, "turns": self.turns}
        left = self.user_turns - len(self.answers)
        if left:
            rec["unanswered_user_turns"] = left
            rec["stopped"] = stopped or last["finish_reason"]
        return rec

    def _messages(self) -> list[dict[str, Any]]:
        out = self._interleave(ask_next=False)
        while out and out[-1]["role"] != "assistant":  # a system turn before an unasked user turn
            out.pop()
        return out

    def _interleave(self, ask_next: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        users = 0
        for m in self.prompt.messages:
            if m["role"] == "user":
                if users >= len(self.answers):
                    out += [m] if ask_next else []
                    break
                out += [m, self.answers[users]]
                users += 1
            else:
                out.append(m)
        return out


class BudgetError(ValueError):
    """The budget cannot be counted (no tokenizer, no chat template); names the setting at fault."""


class Budget:
    """`max_tokens` of each request under `generate.budget_tokens` (see the module docstring)."""

    def __init__(self, total: int, minimum: int, tokenizer_dir: str, enable_thinking: bool) -> None:
        self.total = total
        self.minimum = minimum
        self.enable_thinking = enable_thinking
        self.tok = load_counter(tokenizer_dir) if total else None

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        assert self.tok is not None
        ids = self.tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                           enable_thinking=self.enable_thinking)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # a BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return len(ids)

    def max_tokens(self, messages: list[dict[str, Any]], cap: int) -> tuple[int, int | None]:
        """(max_tokens to ask, prompt tokens or None without a budget); max_tokens 0: do not ask."""
        if self.tok is None:
            return cap, None
        n = self.prompt_tokens(messages)
        left = self.total - n
        return (min(cap, left) if left >= self.minimum else 0), n


def load_counter(path: str) -> Any:
    """The target's tokenizer with its chat template, for counting prompt tokens."""
    p = Path(path)
    if not p.exists():
        raise BudgetError(f"generate.budget_tokens: tokenizer {p} does not exist (generate.tokenizer, "
                          f"else target.path)")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(p))
    except Exception as e:  # transformers raises many kinds
        raise BudgetError(f"generate.budget_tokens: cannot load the tokenizer at {p} ({e})") from e
    if not getattr(tok, "chat_template", None):
        raise BudgetError(f"generate.budget_tokens: the tokenizer at {p} has no chat template")
    return tok


def skip_line(prompt: Prompt, prompt_tokens: int, budget: Budget) -> str:
    """One line of the skipped list: why this conversation was not sent."""
    left = budget.total - prompt_tokens
    if left <= 0:
        why = (f"budget: the first turn's prompt is {prompt_tokens} tokens, {-left} over "
               f"generate.budget_tokens {budget.total}: no room for an answer")
    else:
        why = (f"budget: the first turn's prompt is {prompt_tokens} tokens, leaving {left} of "
               f"generate.budget_tokens {budget.total} (< generate.budget_min_tokens {budget.minimum})")
    return json.dumps({"id": prompt.id, "reason": why, "prompt_tokens": prompt_tokens}, ensure_ascii=False)
