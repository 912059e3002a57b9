"""Fixtures of the data-pipeline tests: the tiny Qwen-style tokenizer (built offline) and record writers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.data.tiny_tokenizer import build_tiny_tokenizer

    out = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tiny_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def tiny_tok(tiny_tok_dir: Path) -> Any:
    from trainer.data.prepare import load_tokenizer

    return load_tokenizer(tiny_tok_dir)
