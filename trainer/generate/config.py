"""Run-config section `generate:` (owned by trainer/generate/)."""
from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True, slots=True)
class GenerateConfig:
    """How completions are regenerated on N OpenAI-compatible (SGLang) endpoints.

    Sizes that matter most: `concurrency` (0 = ask each endpoint for its window via /server_info, else
    /get_server_info: max_running_requests, or when that is null the effective value SGLang computed,
    internal_states[0].effective_max_running_requests_per_dp x dp_size; `default_concurrency`, with a
    warning, only when the server says neither), `shard_records`, `max_tokens`.
    The API key, if the endpoints need one, is read from the environment variable `api_key_env`.

    Sampling is always sent, never left to the server: SGLang fills whatever a request omits from the
    model's generation_config.json (protocol.py, ChatCompletionRequest.to_sampling_params), so the data
    would depend on a file next to the weights. The defaults are Qwen3's thinking-mode recommendation
    (temperature 0.6, top_p 0.95, top_k 20, min_p 0): greedy decoding (temperature 0) makes thinking
    models loop. The data is then *sampled* target text; a drafter trained with KL soft labels from the
    target's logits does not need greedy data. Acceptance-length evaluation wants the target's greedy
    tokens: that is the eval stage's business, not this one's.
    """

    prompts: str = ""  # local path (file or dir of *.jsonl[.zst]) or s3://bucket/key of the prompts
    output: str = "generated"  # output dir, relative to the run dir (and to s3.prefix on S3)
    endpoints: tuple[str, ...] = ()  # OpenAI-compatible base URLs (SGLang instances or the router)
    model: str = ""  # model name sent in requests; "" = target.name, else the target path's basename
    temperature: float = 0.6  # 0 = greedy
    top_p: float = 0.95  # 1.0 = off
    top_k: int = 20  # -1 = off (SGLang's "whole vocabulary")
    min_p: float = 0.0  # 0 = off
    max_tokens: int = 32768
    enable_thinking: bool = True  # chat_template_kwargs.enable_thinking
    # The reasoning parser the SGLang instances run (their --reasoning-parser, role sglang's
    # sglang_reasoning_parser): "" = as each endpoint's server info says; "none" = they run none; a name
    # (e.g. "qwen3") = they run that one. The router's server info does not say, so a run through the
    # router names it here, and an answer is then stored the same way through the router as direct.
    reasoning_parser: str = ""
    concurrency: int = 0  # requests in flight per endpoint; 0 = the endpoint's max_running_requests
    default_concurrency: int = 64  # when the endpoint does not say (e.g. the router)
    api_key_env: str = "SGLANG_API_KEY"  # env var holding the endpoints' API key ("" or unset = none)
    # Send the key over plain http:// to a host other than loopback: anyone on the path reads it. Off by
    # default: with a key set, such an endpoint is refused before any request; use https:// endpoints,
    # or set this for a private network you trust.
    allow_plain_http_key: bool = False
    # CA certificate (PEM) that https:// endpoints are verified against, instead of the system's CAs: the
    # private CA of the SGLang nodes (role sglang, sglang_tls_ca_src). "" = the system's CA store. A path on
    # the machine the stage runs on; a missing file stops the stage before any request.
    ca_file: str = ""
    request_timeout_s: float = 3600.0  # one completion; a timeout puts the endpoint aside
    connect_timeout_s: float = 10.0
    # idle seconds after which a pooled connection is not reused; below the servers' own keep-alive
    # (SGLang closes idle connections after SGLANG_TIMEOUT_KEEP_ALIVE = 5 s)
    keepalive_s: float = 4.0
    max_attempts: int = 5  # server errors (5xx, bad body) per prompt before it is rejected
    failures_to_down: int = 3  # consecutive 5xx that put an endpoint aside (timeouts/resets: at once)
    backoff_initial_s: float = 1.0  # endpoint/S3 backoff, doubled per failure up to backoff_max_s
    backoff_max_s: float = 60.0
    all_down_timeout_s: float = 1800.0  # fail the run when no endpoint was healthy for this long
    retry_flagged: bool = False  # retry finish_reason=length / empty answers once with retry_max_tokens
    retry_max_tokens: int = 0  # 0 = 2 * max_tokens
    max_prompt_chars: int = 400_000  # longer prompts are rejected before any tokenizer is involved
    # Token budget: the training length the completions are for (data.max_length of the run that trains
    # on them); each request asks for at most this minus its prompt's tokens (the target's tokenizer
    # and chat template), capped by max_tokens. 0 = off: every request asks for max_tokens.
    budget_tokens: int = 0
    budget_min_tokens: int = 128  # fewer new tokens left: a first turn is skipped, a later one ends it
    tokenizer: str = ""  # tokenizer dir for the budget; "" = target.path
    shard_records: int = 2000  # records per output shard
    format: Literal["jsonl.zst", "jsonl"] = "jsonl.zst"
    s3_upload: bool = True  # upload shards + manifest when the run has s3.bucket
    progress_interval_s: float = 10.0  # log line with rates, per-endpoint load, ETA

    def __post_init__(self) -> None:
        for url in self.endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"generate.endpoints: {url!r} is not an http(s):// base URL")
        positive = ("max_tokens", "default_concurrency", "max_attempts", "failures_to_down", "shard_records",
                    "request_timeout_s", "connect_timeout_s", "backoff_initial_s", "backoff_max_s",
                    "all_down_timeout_s", "max_prompt_chars", "progress_interval_s", "keepalive_s",
                    "budget_min_tokens")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"generate.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("concurrency", "retry_max_tokens", "budget_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"generate.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"generate.temperature must be within [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"generate.top_p must be within (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"generate.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"generate.min_p must be within [0, 1], got {self.min_p}")
        if self.reasoning_parser != self.reasoning_parser.strip():
            raise ValueError(f"generate.reasoning_parser: {self.reasoning_parser!r} has spaces around it")
        if self.budget_tokens and self.budget_tokens <= self.budget_min_tokens:
            raise ValueError(f"generate.budget_tokens ({self.budget_tokens}) must exceed budget_min_tokens "
                             f"({self.budget_min_tokens}), or be 0 (no budget)")

    @property
    def retry_budget(self) -> int:
        return self.retry_max_tokens or 2 * self.max_tokens
