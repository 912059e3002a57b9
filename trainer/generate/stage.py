"""The `generate` stage: regenerate the completions of the run's prompts on its SGLang endpoints.

Reads the prompts, skips the ids already done (local spool, and S3 when the run has s3.bucket),
regenerates the rest on the endpoints and writes shards under `RunLayout.generate_output`.
Exit status: 0 when every prompt has a completion or a reject, 2 when there is no usable prompt (an
empty prompts file, every prompt rejected: the output is not marked complete) or an endpoint's TLS
certificate does not verify at the first probe, 1 when the run had to stop.
Heavy imports (httpx, boto3) happen inside the stage.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, RunConfig
from trainer.layout import RunLayout

log = logging.getLogger("trainer.generate")

EXIT_BAD_INPUT = 2  # no usable prompt


def model_name(cfg: RunConfig) -> str:
    return cfg.generate.model or cfg.target.name or Path(cfg.target.path).name


def local_prompts(cfg: RunConfig, cache: Path) -> Path:
    """The prompts as a local path; an s3:// file is downloaded once into `cache` (prompts_cache)."""
    src = cfg.generate.prompts
    if not src:
        raise ConfigError("generate.prompts: empty; set a local path or s3://bucket/key of the prompt jsonl")
    if not src.startswith("s3://"):
        path = Path(src)
        if not path.exists():
            raise ConfigError(f"generate.prompts: {path} does not exist")
        return path
    from trainer.s3 import make_client, parse_s3_url

    bucket, key = parse_s3_url(src)
    dest = cache / Path(key).name
    client = make_client(cfg.s3)
    size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    if not dest.exists() or dest.stat().st_size != size:
        dest.parent.mkdir(parents=True, exist_ok=True)
        log.info("generate: downloading %s (%d bytes)", src, size)
        client.download_file(bucket, key, str(dest) + ".tmp")
        os.replace(str(dest) + ".tmp", dest)
    return dest


def adopt_remote(mirror: Any, timeout_s: float, backoff_s: float, backoff_max_s: float) -> int | None:
    """Fetch the progress on S3. While S3 is unreachable: a spool that has synced before knows what is
    done (go on from it); an empty spool (a new node) must not guess, so it retries until `timeout_s`
    and then gives up (None) rather than regenerate ids that S3 may already hold. A sidecar on S3 whose
    shard name would leave the output dir is no outage: None at once, the log naming it."""
    from trainer.generate.store import SidecarError

    deadline = time.monotonic() + timeout_s
    delay = backoff_s
    while True:
        try:
            return int(mirror.adopt_remote())
        except SidecarError as e:
            log.error("generate: cannot take over the progress on %s: %s", mirror.url(), e)
            return None
        except Exception as e:  # any S3/network error
            why = f"{type(e).__name__}: {e}"
            if mirror.store.shards:
                log.warning("generate: cannot read the progress on %s (%s); resuming from the local spool",
                            mirror.url(), why)
                return 0
            if time.monotonic() + delay > deadline:
                log.error("generate: cannot read the progress on %s (%s) and the local spool is empty; "
                          "not starting blind (generate.all_down_timeout_s)", mirror.url(), why)
                return None
            log.warning("generate: S3 %s unreachable (%s); retry in %.0fs", mirror.url(), why, delay)
            time.sleep(delay)
            delay = min(backoff_max_s, 2 * delay)


def stage(cfg: RunConfig) -> int:
    from trainer.generate.endpoints import plain_http_key_refusal
    from trainer.generate.store import ShardStore, StoreLocked

    g = cfg.generate
    if not g.endpoints:
        raise ConfigError("generate.endpoints: empty; list the SGLang base URLs (e.g. http://10.0.0.5:30000)")
    refusal = plain_http_key_refusal(g, os.environ.get(g.api_key_env, "") if g.api_key_env else "")
    if refusal:  # before anything is read or sent
        raise ConfigError(refusal)
    layout = RunLayout.of(cfg)
    try:
        store = ShardStore(layout.generate_output, g.format, g.shard_records)
    except StoreLocked as e:
        log.error("generate: %s", e)
        return 1
    try:
        return _generate(cfg, layout, store)
    finally:
        store.close()


def _generate(cfg: RunConfig, layout: RunLayout, store: Any) -> int:
    import asyncio

    from trainer.generate.endpoints import Endpoint, TLSVerifyError
    from trainer.generate.prompts import count_lines, prompt_files, read_prompts
    from trainer.generate.remote import S3Mirror
    from trainer.generate.runner import GenerateError, Generator, NoValidInput, rejects_line

    g = cfg.generate
    out = layout.generate_output
    for note in store.recover():
        log.info("generate: %s", note)
    mirror = None
    if cfg.s3.enabled and g.s3_upload:
        from trainer.s3 import join_key, make_client

        mirror = S3Mirror(make_client(cfg.s3), cfg.s3.bucket, join_key(cfg.s3.prefix, g.output), store,
                          backoff_initial_s=g.backoff_initial_s, backoff_max_s=g.backoff_max_s,
                          concurrency=cfg.s3.concurrency)
        fetched = adopt_remote(mirror, g.all_down_timeout_s, g.backoff_initial_s, g.backoff_max_s)
        if fetched is None:
            return 1
        if fetched:
            log.info("generate: %d shards done elsewhere fetched from %s", fetched, mirror.url())
    try:
        files = prompt_files(local_prompts(cfg, layout.prompts_cache))
    except FileNotFoundError as e:
        raise ConfigError(f"generate.prompts: {e}") from None
    lines = count_lines(files)
    if not lines and not store.done:
        raise ConfigError(f"generate.prompts: {cfg.generate.prompts}: no prompt (the file is empty); "
                          "nothing to generate")
    total = max(lines - len(store.done), 0)
    log.info("generate: %d prompts in %d files, %d already done, model %s, %d endpoints -> %s",
             total + len(store.done), len(files), len(store.done), model_name(cfg), len(g.endpoints), out)
    api_key = os.environ.get(g.api_key_env, "") if g.api_key_env else ""
    endpoints = [Endpoint(u, g, api_key) for u in g.endpoints]
    prompts = read_prompts(files, g.max_prompt_chars, cfg.data.max_line_bytes)
    gen = Generator(g, model_name(cfg), endpoints, store, prompts,
                    layout.generate_rejects, mirror, progress_path=layout.generate_progress,
                    budget=budget(cfg), skipped_path=layout.generate_skipped)
    try:
        summary = asyncio.run(gen.run(total))
    except (NoValidInput, TLSVerifyError) as e:
        log.error("generate: %s", e)
        return EXIT_BAD_INPUT
    except GenerateError as e:
        log.error("generate: %s", e)
        return 1
    layout.generate_summary.write_text(json.dumps(summary, indent=1))
    gen.progress.log_summary(summary)
    if summary["rejected"]:
        log.warning("generate: %d prompts rejected (%s), every reason in %s", summary["rejected"],
                    rejects_line(gen.reject_kinds, gen.reject_examples), layout.generate_rejects)
    if summary["skipped_budget"]:
        log.warning("generate: %d conversations not sent: the token budget left less than "
                    "generate.budget_min_tokens for their first turn (listed in %s)",
                    summary["skipped_budget"], layout.generate_skipped)
    return 0


def budget(cfg: RunConfig) -> Any:
    """The token budget of each request (off when generate.budget_tokens is 0)."""
    from trainer.generate.turns import Budget, BudgetError

    g = cfg.generate
    try:
        b = Budget(g.budget_tokens, g.budget_min_tokens, g.tokenizer or cfg.target.path, g.enable_thinking)
    except BudgetError as e:
        raise ConfigError(str(e)) from None
    if g.budget_tokens:
        log.info("generate: token budget %d per sample (generate.budget_tokens): each request asks for "
                 "at most that minus its prompt's tokens, capped by max_tokens %d",
                 g.budget_tokens, g.max_tokens)
    return b
