"""Run-config section `generate:` (owned by trainer/generate/)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class GenerateConfig:
    prompts: str = ""  # local path or s3://bucket/key of the prompt jsonl
    output: str = "generated"  # output dir, relative to the run dir
    endpoints: tuple[str, ...] = ()  # OpenAI-compatible base URLs (SGLang instances or the router)
    temperature: float = 0.0
    max_tokens: int = 32768
