"""Model mode of the SGLang double: the completion decoded by a real model directory on the CPU.

`python3 tests/doubles/sglang_server.py --port N --model-dir DIR [--reasoning-parser qwen3]` answers each
chat request with what the model in DIR writes for it, so that `generate` stores the target's own text
(the fast mode answers a digest of the messages instead). It is a double of SGLang's answer, not of its
engine (references are to sgl-project/sglang, python/sglang/srt/):

- The prompt is the tokenizer's chat template with `add_generation_prompt=True` and the request's
  `chat_template_kwargs` (entrypoints/openai/serving_chat.py, `_apply_jinja_template`).
- Decoding is transformers' `generate`: greedy when the request's temperature is 0 (SGLang turns a
  temperature below 1e-6 into top_k=1, sampling/sampling_params.py), else sampled with its temperature,
  top_p, top_k (-1 = off) and min_p; a request without sampling fields gets SGLang's defaults
  (temperature 1.0, top_p 1.0, top_k -1, min_p 0) as the generator never relies on them.
- It stops at the tokenizer's eos token or `<|endoftext|>` (SGLang stops on the model's eos ids):
  finish_reason "stop" with `matched_stop` the id it stopped on, which is not part of the text; or at
  max_tokens: finish_reason "length". `usage.completion_tokens` counts the stop token, as SGLang's
  output_ids do.
- The text is decoded with the stop token cut off and without skipping special tokens: Qwen's
  `<think>`/`</think>` are not "special" in its tokenizer, so SGLang's detokenizer keeps them; the tiny
  tokenizers list them as special, which would drop them otherwise.
- The thinking is split as `--reasoning-parser qwen3` does (parser/reasoning_parser.py,
  `BaseReasoningFormatDetector.detect_and_parse`, with force_reasoning when thinking is on): `<think>`
  removed and the text stripped, split at the first `</think>`, the answer stripped; no `</think>` at all
  means everything is reasoning (cut by max_tokens). Without the parser the text is returned as written.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclasses.dataclass
class Decoded:
    text: str  # what the model wrote, stop token excluded
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" or "length"
    matched_stop: int | None


def split_reasoning(text: str, enable_thinking: bool) -> tuple[str, str]:
    """(reasoning, answer) of `text` as SGLang's qwen3 reasoning parser splits it."""
    if not enable_thinking and THINK_OPEN not in text:
        return "", text
    body = text.replace(THINK_OPEN, "").strip()
    if THINK_CLOSE not in body:
        return body, ""
    reasoning, answer = body.split(THINK_CLOSE, 1)
    return reasoning, answer.strip()


class ModelDecoder:
    """A model directory (config, safetensors, tokenizer with a chat template) decoding on the CPU."""

    def __init__(self, path: str, seed: int = 0) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        if not getattr(self.tok, "chat_template", None):
            raise ValueError(f"{path}: the tokenizer has no chat template")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        stops = [self.tok.eos_token_id, self.tok.convert_tokens_to_ids("<|endoftext|>")]
        self.stop_ids = sorted({int(i) for i in stops if isinstance(i, int) and i >= 0
                                and i != self.tok.unk_token_id})
        self.lock = threading.Lock()  # one decode at a time: the CPU is the engine
        self.seed = seed
        self.calls = 0

    def prompt_ids(self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any]) -> list[int]:
        keep = ("role", "content", "reasoning_content")
        turns = [{k: v for k, v in m.items() if k in keep} for m in messages]
        text = self.tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True,
                                            **template_kwargs)
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, prompt: list[int], max_tokens: int, sampling: dict[str, Any]) -> Decoded:
        import torch

        temperature = float(sampling.get("temperature", 1.0))
        kw: dict[str, Any] = {"max_new_tokens": max_tokens, "eos_token_id": self.stop_ids,
                              "pad_token_id": self.stop_ids[0], "do_sample": temperature >= 1e-6}
        if kw["do_sample"]:
            top_k = int(sampling.get("top_k", -1))
            kw.update(temperature=temperature, top_p=float(sampling.get("top_p", 1.0)),
                      top_k=top_k if top_k > 0 else None, min_p=float(sampling.get("min_p", 0.0)) or None)
        else:
            kw.update(temperature=None, top_p=None, top_k=None)
        with self.lock, torch.no_grad():
            self.calls += 1
            torch.manual_seed(self.seed * 1_000_003 + self.calls)
            out = self.model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                      dtype=torch.long), **kw)
        new = [int(i) for i in out[0, len(prompt):]]
        stop = next((j for j, t in enumerate(new) if t in self.stop_ids), None)
        if stop is not None:
            matched, n, new = new[stop], stop + 1, new[:stop]
            finish = "stop"
        else:
            matched, n, finish = None, len(new), "length"
        return Decoded(self.tok.decode(new, skip_special_tokens=False), len(prompt), n, finish, matched)


def answer(decoder: ModelDecoder, req: dict[str, Any], model: str, parser: str, context_length: int,
           max_tokens: int) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of a chat completion decoded by `decoder`, in SGLang's response shape."""
    import time
    import uuid

    kwargs = dict(req.get("chat_template_kwargs") or {})
    thinking = bool(kwargs.get("enable_thinking", True))
    prompt = decoder.prompt_ids(req["messages"], kwargs)
    if len(prompt) + max_tokens > context_length:
        return 400, {"object": "error", "type": "BadRequestError", "param": None, "code": 400, "message": (
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {len(prompt) + max_tokens} tokens: {len(prompt)} tokens from the "
            f"input messages and {max_tokens} tokens for the completion.")}
    sampling = {k: req[k] for k in ("temperature", "top_p", "top_k", "min_p") if req.get(k) is not None}
    out = decoder.decode(prompt, max_tokens, sampling)
    if parser == "qwen3":
        reasoning, content = split_reasoning(out.text, thinking)
        # serving_chat.py _build_chat_response: content "" (never null), an empty reasoning is null
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None,
                   "tool_calls": None}
    else:
        message = {"role": "assistant", "content": out.text, "reasoning_content": None, "tool_calls": None}
    return 200, {
        "id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
        "model": req.get("model") or model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": out.finish_reason,
                     "matched_stop": out.matched_stop}],
        "usage": {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                  "total_tokens": out.prompt_tokens + out.completion_tokens, "prompt_tokens_details": None},
        "metadata": {"weight_version": "default"},
    }
