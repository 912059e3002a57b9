"""A tiny Qwen-style tokenizer built offline, for tests and the lab (no hub download).

Byte-level BPE (GPT-2 / Qwen style pre-tokenisation) trained deterministically on a small built-in
corpus, with Qwen's special tokens and a Qwen3-like chat template: `enable_thinking`, reasoning from
`reasoning_content` (or inline `<think>` in content) rendered inside `<think>...</think>` for the
turns after the last user query only — earlier turns' reasoning is dropped, as Qwen's templates do.
Total vocab < 512 so that it fits the tiny target model (vocab 512).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|mask|>",  # spare id: the drafter's MASK token in tiny runs
)
MASK_TOKEN = "<|mask|>"
VOCAB_SIZE = 480  # byte-level alphabet (256) + merges + special tokens; < 512

# Qwen3's template, trimmed of tool calls: system first, assistant reasoning only after the last user query.
CHAT_TEMPLATE = r"""{%- if messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns2 = namespace(last_query_index=-1) %}
{%- for message in messages %}
{%- if message.role == 'user' %}{%- set ns2.last_query_index = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.content is string %}{%- set content = message.content %}
{%- else %}{%- set content = '' %}{%- endif %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}
{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns2.last_query_index and (loop.last or reasoning_content) %}
{{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') }}
{{- '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|im_start|>assistant\n' + content }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\n\n</think>\n\n' }}
{%- endif %}
{%- endif %}"""

_CORPUS = """\
The quick brown fox jumps over the lazy dog. Let me think about this step by step.
First, we need to understand the question. Then we compute the answer and check it.
def main():\n    return sum(x * x for x in range(10))\n
The answer is 42. Therefore, the result follows. So the final answer is 7.
User asks: what is the capital of France? The capital of France is Paris.
We have x + y = 10 and x - y = 2, so x = 6 and y = 4. Hmm, wait, let me verify that.
import torch\nfrom pathlib import Path\nclass Model:\n    def forward(self, input_ids):\n        pass\n
In summary, the speculative decoding drafter predicts a block of tokens in parallel.
"""


def _train_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def build_tiny_tokenizer(out_dir: str | Path | None = None) -> Any:
    """A `PreTrainedTokenizerFast` with Qwen special tokens and a Qwen3-like chat template (vocab < 512).

    Deterministic: the same ids on every machine. Saved with `save_pretrained(out_dir)` when given.
    """
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<think>", "</think>", MASK_TOKEN],
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    if len(tok) >= 512:  # pragma: no cover - guarded by a test
        raise AssertionError(f"tiny tokenizer has {len(tok)} tokens; the tiny target has 512")
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        tok.save_pretrained(str(out_dir))
    return tok
