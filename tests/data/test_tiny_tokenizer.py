"""The offline tiny tokenizer: Qwen special tokens as single ids, vocab < 512, a Qwen3-like template."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.data.tiny_tokenizer import MASK_TOKEN, SPECIAL_TOKENS, build_tiny_tokenizer

MSGS = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "add them"},
]


def test_vocab_fits_the_tiny_target_and_specials_are_single_ids(tiny_tok: Any) -> None:
    assert len(tiny_tok) < 512
    ids = [tiny_tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS) and max(ids) < 512
    for tok in SPECIAL_TOKENS:
        assert tiny_tok(tok, add_special_tokens=False)["input_ids"] == [tiny_tok.convert_tokens_to_ids(tok)]
    assert tiny_tok.eos_token == "<|im_end|>" and tiny_tok.pad_token == "<|endoftext|>"
    assert MASK_TOKEN in tiny_tok.get_vocab()


def test_deterministic_and_saved(tmp_path: Path, tiny_tok: Any) -> None:
    from transformers import AutoTokenizer

    again = build_tiny_tokenizer(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    text = "Let me think step by step. <think>x</think><|im_end|>"
    assert again(text)["input_ids"] == tiny_tok(text)["input_ids"] == loaded(text)["input_ids"]
    assert loaded.chat_template == tiny_tok.chat_template


def test_template_drops_earlier_reasoning_and_keeps_the_last(tiny_tok: Any) -> None:
    text = tiny_tok.apply_chat_template(MSGS, tokenize=False, enable_thinking=True)
    assert "greet back" not in text  # earlier turn's reasoning dropped, as Qwen3 does
    assert "<|im_start|>assistant\nHello!<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n")


def test_generation_prompt_honours_enable_thinking(tiny_tok: Any) -> None:
    on = tiny_tok.apply_chat_template(MSGS[:3], tokenize=False, add_generation_prompt=True,
                                      enable_thinking=True)
    off = tiny_tok.apply_chat_template(MSGS[:3], tokenize=False, add_generation_prompt=True,
                                       enable_thinking=False)
    assert on.endswith("<|im_start|>assistant\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_inline_think_in_content_is_rendered_like_reasoning_content(tiny_tok: Any) -> None:
    inline = [MSGS[0], {"role": "assistant", "content": "<think>\nponder\n</think>\n\nYes."}]
    split = [MSGS[0], {"role": "assistant", "content": "Yes.", "reasoning_content": "ponder"}]
    render = tiny_tok.apply_chat_template
    assert render(inline, tokenize=False) == render(split, tokenize=False)
