"""Tiny random targets built on the spot (tests, the lab, `bench/ --tiny`): no model hub needed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_TARGET = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16,
)


def tiny_target_config(vocab_size: int = 512, **overrides: Any) -> Any:
    from transformers import Qwen3_5TextConfig

    kw = {**TINY_TARGET, "vocab_size": vocab_size, **overrides}
    return Qwen3_5TextConfig(**kw)


def build_tiny_model(vocab_size: int = 512, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random Qwen3_5ForCausalLM in memory (the sizes in TINY_TARGET)."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(tiny_target_config(vocab_size, **overrides))
    # zero-centred norms start at 0 (=1x); randomise a little so layers differ in tests
    return model.eval()


def build_tiny_target(out_dir: str | Path, vocab_size: int = 512, tokenizer: Any = None,
                      seed: int = 0) -> Path:
    """Save a tiny random Qwen3_5ForCausalLM (and `tokenizer`, if given) to `out_dir`; returns the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None and len(tokenizer) > vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, more than vocab_size={vocab_size}")
    build_tiny_model(vocab_size, seed).save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
