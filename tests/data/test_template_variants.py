"""prepare's rendering uses only the tokenizer's own chat template and the special-token strings.

Checked here with a second template shaped like Qwen3.5/3.6's (tool calls rendered as `<tool_call>`
JSON, tool results as `<tool_response>` user turns, `<think>\\n` opened by the generation prompt,
reasoning kept only after the last real user query) — written for this test, not a copy of Qwen's file.
The real Qwen3.6 tokenizer cannot be downloaded here; this is the closest faithful stand-in.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest

from trainer.data.records import normalize
from trainer.data.render import expand

QWEN35_LIKE = r"""{%- if messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == 'user'
      and not message.content.startswith('<tool_response>') %}
{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{%- set reasoning_content = message.reasoning_content if message.reasoning_content is string else '' %}
{%- if loop.index0 > ns.last_query_index %}
{{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content }}
{%- else %}
{{- '<|im_start|>assistant\n' + content }}
{%- endif %}
{%- if message.tool_calls %}
{%- for call in message.tool_calls %}
{{- '\n<tool_call>\n' + (call.function | tojson) + '\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}
{%- else %}{{- '<think>\n' }}{%- endif %}
{%- endif %}"""

AGENT = {
    "id": "agent-1",
    "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What is 17 * 23? Use the calculator."},
        {"role": "assistant", "content": "", "reasoning_content": "I should call mul.",
         "tool_calls": [{"type": "function", "function": {"name": "mul", "arguments": {"a": 17, "b": 23}}}]},
        {"role": "tool", "content": "391"},
        {"role": "assistant", "content": "17 * 23 = 391.", "reasoning_content": "The tool said 391."},
    ],
    "finish_reason": "stop",
}


@pytest.fixture()
def qwen35_tok(tiny_tok: Any) -> Any:
    tok = copy.deepcopy(tiny_tok)
    tok.chat_template = QWEN35_LIKE
    return tok


def _supervised(tok: Any, row: Any) -> str:
    return tok.decode([i for i, m in zip(row.input_ids, row.loss_mask, strict=True) if m])


def test_agent_conversation_with_tool_calls(qwen35_tok: Any) -> None:
    rows = expand(normalize(AGENT, "agent.jsonl:1"), qwen35_tok, 4096)
    assert len(rows) == 2
    first, last = (_supervised(qwen35_tok, r) for r in rows)
    # reasoning of both turns is kept: both come after the last real user query (tool results don't count)
    assert first.startswith("<think>\nI should call mul.\n</think>\n\n\n<tool_call>\n")
    assert '"name": "mul"' in first and first.endswith("</tool_call><|im_end|>")
    assert last == "<think>\nThe tool said 391.\n</think>\n\n17 * 23 = 391.<|im_end|>"
    text = qwen35_tok.decode(rows[1].input_ids)
    assert "<tool_response>\n391\n</tool_response>" in text and "I should call mul." in text


def test_mask_is_the_generated_text_when_the_prompt_opens_think(qwen35_tok: Any) -> None:
    """With `<think>\\n` in the generation prompt, the mask still starts at `<think>`: the
    supervised tokens are the prompt's `<think>\\n` plus everything the target generated after it."""
    conv = normalize(AGENT, "agent.jsonl:1")
    row = expand(conv, qwen35_tok, 4096)[-1]
    prompt = qwen35_tok.apply_chat_template(conv.messages[:-1], tokenize=False, add_generation_prompt=True,
                                            enable_thinking=True)
    prompt_ids = qwen35_tok(prompt, add_special_tokens=False)["input_ids"]
    assert row.input_ids[: len(prompt_ids)] == prompt_ids  # rendering is consistent with generation
    head = qwen35_tok("<think>\n", add_special_tokens=False)["input_ids"]
    assert row.n_supervised == len(row.input_ids) - len(prompt_ids) + len(head)
