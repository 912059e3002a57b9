"""The dispatch loop: conversations -> least-loaded healthy endpoint -> the local spool (exactly once).

Each endpoint has a window (its capacity); a conversation goes to the healthy endpoint with the lowest
in-flight/capacity ratio that has room, or back to the endpoint of its earlier turns when that one has
room (SGLang's prefix cache holds them). It holds one slot there while its turns are asked one after
the other (trainer/generate/turns.py), so a slot is one request in flight. Outcomes of a request:
  200            the answer is appended; after the last turn (or a turn cut at its limit) the whole
                 conversation is written to the spool. A flagged turn, with `retry_flagged`, is asked
                 once more with the larger budget;
  200 + abort    finish_reason "abort" (SGLang's /abort_request, pause or weight update with abort,
                 scheduler shutdown) carries partial text: never kept, the turn is asked again (one of
                 its `max_attempts`);
  reset          the request was already sent once more on a fresh connection when it failed before
                 any answer (trainer/generate/endpoints.py). If GET /health still answers, only the
                 turn is re-queued (one of its `max_attempts`); else the endpoint is put aside;
  timeout        the endpoint is put aside (the turn's attempt counts);
  put aside      with backoff: its in-flight requests are cancelled and re-queued, and it gets work
                 again only after GET /health answers;
  429/5xx        re-queued; `failures_to_down` in a row put the endpoint aside; a turn that fails
                 `max_attempts` times rejects the conversation with the last error;
  401/403/404    the endpoint is disabled for the run (configuration error; on the /health probe too);
  TLS            a certificate that does not verify at the first probe stops the run (exit 2): the CA
                 the run trusts is wrong, which waiting will not mend; later, it disables the endpoint;
  other 4xx      the conversation is rejected with the endpoint's message (e.g. over the context length).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.generate.config import GenerateConfig
from trainer.generate.endpoints import (
    TIMEOUT_ERRORS,
    TRANSPORT_ERRORS,
    Endpoint,
    FatalEndpointError,
    TLSVerifyError,
    parse_completion,
)
from trainer.generate.progress import Progress
from trainer.generate.prompts import Prompt, Reject, reject_kind, rejects_line
from trainer.generate.remote import S3Mirror
from trainer.generate.store import ShardStore
from trainer.generate.turns import Budget, Work, skip_line

log = logging.getLogger("trainer.generate")


class GenerateError(RuntimeError):
    """The run cannot go on (no endpoint left, S3 never came back ...)."""


class NoValidInput(GenerateError):
    """No prompt could be used: nothing to generate, and the output is not marked complete."""


class Generator:
    def __init__(self, cfg: GenerateConfig, model: str, endpoints: list[Endpoint], store: ShardStore,
                 source: Iterator[Prompt | Reject], rejects_path: Path,
                 mirror: S3Mirror | None = None, progress_path: Path | None = None,
                 budget: Budget | None = None, skipped_path: Path | None = None) -> None:
        self.cfg = cfg
        self.model = model
        self.endpoints = endpoints
        self.store = store
        self.source = source
        self.source_done = False
        self.mirror = mirror
        self.queue: collections.deque[Work] = collections.deque()
        self.wake = asyncio.Event()
        self.progress = Progress(endpoints, cfg.progress_interval_s, progress_path)
        self.background: set[asyncio.Task] = set()
        self.seals: set[asyncio.Task] = set()
        self.rejects = rejects_path.open("w", encoding="utf-8")
        self.budget = budget or Budget(0, 0, "", cfg.enable_thinking)
        self.skipped = (skipped_path or rejects_path.with_name("skipped.ndjson")).open("w", encoding="utf-8")
        self.no_endpoint_since: float | None = None
        self.reject_kinds: collections.Counter[str] = collections.Counter()
        self.reject_examples: list[str] = []

    # ------------------------------------------------------------------ feeding
    def _reject(self, rej: Reject) -> None:
        self.rejects.write(json.dumps(rej.to_json(), ensure_ascii=False) + "\n")
        self.rejects.flush()
        self.progress.c.rejected += 1
        self.reject_kinds[reject_kind(rej.reason)] += 1
        if len(self.reject_examples) < 3:
            where = f"{Path(rej.source).name}:{rej.line}" if rej.line else rej.source
            self.reject_examples.append(f"{where}" + (f" (id {rej.id})" if rej.id else ""))

    def _fill(self) -> None:
        want = max(256, 2 * sum(e.capacity for e in self.endpoints))
        while not self.source_done and len(self.queue) < want:
            item = next(self.source, None)
            if item is None:
                self.source_done = True
            elif isinstance(item, Reject):
                self._reject(item)
            elif item.id in self.store.done:
                self.progress.c.skipped_done += 1
            else:
                self.queue.append(Work(item, self.cfg.max_tokens))

    def _pick(self, work: Work) -> Endpoint | None:
        if work.pinned is not None and work.pinned.free():
            return work.pinned  # the endpoint whose prefix cache holds the earlier turns
        free = [e for e in self.endpoints if e.free()]
        return min(free, key=lambda e: e.load) if free else None

    def _dispatch(self) -> None:
        while self.queue:
            ep = self._pick(self.queue[0])
            if ep is None:
                return
            work = self.queue.popleft()
            work.pinned = ep
            ep.inflight += 1
            task = asyncio.create_task(self._request(ep, work))
            ep.tasks.add(task)
            task.add_done_callback(functools.partial(self._request_done, ep, work))

    # ------------------------------------------------------------------ one request
    def _body(self, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
        # every sampling field is sent: SGLang fills an omitted one from the model's generation_config
        return {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": self.cfg.temperature, "top_p": self.cfg.top_p, "top_k": self.cfg.top_k,
                "min_p": self.cfg.min_p, "stream": False,
                "chat_template_kwargs": {"enable_thinking": self.cfg.enable_thinking},
                "separate_reasoning": True}

    async def _request(self, ep: Endpoint, work: Work) -> None:
        try:
            await self._call(ep, work)
        except asyncio.CancelledError:
            self._requeue(work)  # the endpoint was put aside while this request was in flight

    def _request_done(self, ep: Endpoint, work: Work, task: asyncio.Task[None]) -> None:
        # Bookkeeping lives in a done-callback, not in _request: a task cancelled before its first step
        # never enters the coroutine, so a `finally` there would leak the slot and lose the prompt.
        ep.inflight -= 1
        ep.tasks.discard(task)
        if task.cancelled():
            self._requeue(work)
        self.wake.set()

    def _requeue(self, work: Work) -> None:
        self.progress.c.requeued += 1
        self.queue.appendleft(work)

    def _put_aside(self, ep: Endpoint, reason: str) -> None:
        if not ep.mark_down(reason):
            return
        me = asyncio.current_task()
        for task in list(ep.tasks):
            if task is not me:
                task.cancel()
        self._spawn(self._recover(ep))

    async def _call(self, ep: Endpoint, work: Work) -> None:
        """Ask the conversation's turns one after the other on `ep`; write it when done."""
        while True:
            messages = work.so_far()
            max_tokens, prompt_tokens = self.budget.max_tokens(messages, work.max_tokens)
            if not max_tokens:
                self._out_of_budget(ep, work, prompt_tokens or 0)
                return
            comp = await self._ask(ep, work, self._body(messages, max_tokens))
            if comp is None:
                return  # re-queued, rejected or put aside: _ask has dealt with it
            if not self._turn(ep, work, comp):
                return
            if work.done():
                self._finish(ep, work)
                return

    async def _ask(self, ep: Endpoint, work: Work, body: dict[str, Any]) -> Any:
        """One request; the parsed answer, or None when the outcome was handled here."""
        try:
            r = await ep.post("/v1/chat/completions", body)
        except TIMEOUT_ERRORS as e:
            ep.errors += 1
            # a prompt that times out everywhere must not bounce between endpoints forever
            self._attempt_failed(ep, work, f"timeout after {self.cfg.request_timeout_s:.0f}s")
            self._put_aside(ep, f"timeout ({type(e).__name__})")
            return None
        except TRANSPORT_ERRORS as e:
            ep.errors += 1
            await self._transport_error(ep, work, f"{type(e).__name__}: {e}")
            return None
        if r.status_code == 200:
            try:
                comp = parse_completion(r.json(), ep.parses_reasoning)
            except ValueError as e:
                self._server_error(ep, work, f"bad response body: {e}")
                return None
            ep.consecutive_failures = 0
            ep.backoff = 0.0
            if comp.finish_reason == "abort":
                # aborted by the server, not by the prompt: no completion, and not the endpoint failing
                # (an abort_all hits every request at once; it must not put the endpoint aside)
                self.progress.c.aborted += 1
                tokens = comp.usage.get("completion_tokens")
                self._attempt_failed(ep, work, f"finish_reason abort after {tokens} tokens")
                return None
            return comp
        if r.status_code in (401, 403, 404):
            ep.errors += 1
            self._requeue(work)
            ep.disabled = f"HTTP {r.status_code} on {ep.base}/v1/chat/completions: {r.text[:200]}"
            log.error("endpoint %s disabled for this run: %s (check generate.endpoints and $%s)",
                      ep.url, ep.disabled, self.cfg.api_key_env)
            self._put_aside(ep, ep.disabled)
        elif r.status_code == 429 or r.status_code >= 500:
            self._server_error(ep, work, f"HTTP {r.status_code}: {r.text[:300]}")
        else:
            self.progress.c.rejected_by_endpoint += 1
            self._reject(Reject("endpoint", 0, f"{ep.url} answered HTTP {r.status_code}: {r.text[:300]}",
                                work.prompt.id))
        return None

    async def _transport_error(self, ep: Endpoint, work: Work, reason: str) -> None:
        """A request failed on a fresh connection too: the instance is put aside only when its /health
        fails as well; otherwise the connection was at fault and only the turn is asked again."""
        if await ep.health_ok():
            self.progress.c.transport_errors += 1
            log.warning("endpoint %s: a request failed (%s) but /health answers; the turn is asked again",
                        ep.url, reason[:200])
            self._attempt_failed(ep, work, reason)
            return
        self._requeue(work)
        self._put_aside(ep, reason)

    def _attempt_failed(self, ep: Endpoint, work: Work, reason: str) -> None:
        """Count a failed attempt; re-queue the prompt, or reject it after `max_attempts`."""
        work.attempts += 1
        work.last_error = f"{ep.url}: {reason}"
        if work.attempts >= self.cfg.max_attempts:
            self.progress.c.rejected_by_endpoint += 1
            self._reject(Reject("endpoint", 0, f"failed {work.attempts} times, last: {work.last_error}",
                                work.prompt.id))
        else:
            self._requeue(work)

    def _server_error(self, ep: Endpoint, work: Work, reason: str) -> None:
        ep.errors += 1
        self.progress.c.server_errors += 1
        self._attempt_failed(ep, work, reason)
        ep.consecutive_failures += 1
        if ep.consecutive_failures >= self.cfg.failures_to_down:
            self._put_aside(ep, f"{self.cfg.failures_to_down} server errors in a row, last {reason[:120]}")

    def _turn(self, ep: Endpoint, work: Work, comp: Any) -> bool:
        """Keep an answered turn; False when it was re-queued to be asked again with the larger budget."""
        flag = comp.flag
        if flag:
            if self.cfg.retry_flagged and not work.retried_flagged:
                work.retried_flagged = True
                work.max_tokens = max(work.max_tokens, self.cfg.retry_budget)
                self.progress.c.retried_flagged += 1
                self.queue.appendleft(work)
                return False
            self.progress.c.flagged[flag] += 1
        tokens = int(comp.usage.get("completion_tokens") or 0)
        ep.tokens_out += tokens
        self.progress.answered(tokens)
        work.answered({"role": "assistant", "content": comp.content, "reasoning_content": comp.reasoning},
                      {"finish_reason": comp.finish_reason, "usage": comp.usage, "endpoint": ep.url})
        work.max_tokens = self.cfg.max_tokens
        return True

    def _out_of_budget(self, ep: Endpoint, work: Work, prompt_tokens: int) -> None:
        """The budget leaves too little for the next turn: skip a new conversation, end a started one."""
        if work.answers:
            self._finish(ep, work, stopped="budget")
            return
        self.skipped.write(skip_line(work.prompt, prompt_tokens, self.budget) + "\n")
        self.skipped.flush()
        self.progress.c.skipped_budget += 1

    def _finish(self, ep: Endpoint, work: Work, stopped: str = "") -> None:
        full = self.store.write(work.record(stopped))
        ep.completed += 1
        self.progress.completed()
        if full is not None:
            self._seal(full)

    # ------------------------------------------------------------------ shards
    def _seal(self, path: Path) -> None:
        async def seal() -> None:
            info = await asyncio.to_thread(self.store.seal, path)
            self.store.register(info)
            self.store.write_manifest(self.store.manifest())
            if self.mirror is not None:
                self.mirror.enqueue(info)

        task = asyncio.create_task(seal())
        self.seals.add(task)
        task.add_done_callback(self.seals.discard)

    async def _recover(self, ep: Endpoint) -> None:
        await ep.recover()
        self.wake.set()  # dispatch to it now, not at the next 1 s tick

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # ------------------------------------------------------------------ main loop
    async def _probe_all(self) -> None:
        async def probe(ep: Endpoint) -> None:
            try:
                ep.up = await ep.probe()
            except TLSVerifyError:
                raise  # the run's trust is wrong, not this endpoint: stop before anything is sent
            except FatalEndpointError as e:
                ep.disabled = str(e)
                log.error("endpoint %s disabled for this run: %s", ep.url, e)
                return
            if ep.up:
                log.info("endpoint %s: healthy, window %d (%s)", ep.url, ep.capacity, ep.window_reason)
            else:
                log.warning("endpoint %s: not healthy yet (%s); probing with backoff", ep.url, ep.down_reason)
                ep.backoff = self.cfg.backoff_initial_s
                self._spawn(self._recover(ep))

        await asyncio.gather(*(probe(e) for e in self.endpoints))

    def _check_endpoints(self) -> None:
        if all(e.disabled for e in self.endpoints):
            raise GenerateError("every endpoint is disabled: " + "; ".join(f"{e.url}: {e.disabled}"
                                                                         for e in self.endpoints))
        if any(e.up for e in self.endpoints):
            self.no_endpoint_since = None
            return
        now = time.monotonic()
        self.no_endpoint_since = self.no_endpoint_since or now
        if now - self.no_endpoint_since > self.cfg.all_down_timeout_s:
            states = "; ".join(e.describe() for e in self.endpoints)
            raise GenerateError(f"no healthy endpoint for {self.cfg.all_down_timeout_s:.0f}s "
                                f"(generate.all_down_timeout_s): {states}")

    async def run(self, total: int) -> dict[str, Any]:
        """Generate every prompt not yet done; returns the summary."""
        uploader = self.mirror.start() if self.mirror is not None else None
        self.progress.start(total, already_done=len(self.store.done))
        ticker = asyncio.create_task(self.progress.run())
        try:
            await self._probe_all()
            while True:
                self._fill()
                self._dispatch()
                inflight = sum(e.inflight for e in self.endpoints)
                if not self.queue and self.source_done and not inflight:
                    break
                if self.queue:
                    self._check_endpoints()
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            last = self.store.rotate()
            if last is not None:
                self._seal(last)
            while self.seals:
                await asyncio.gather(*list(self.seals))
        finally:
            ticker.cancel()
            for task in [*self.background, *(t for e in self.endpoints for t in e.tasks)]:
                task.cancel()
            self.rejects.close()
            self.skipped.close()
            self.progress.close()
            for ep in self.endpoints:
                await ep.aclose()
        self.progress.tick()
        summary = self.progress.summary(records_total=len(self.store.done), shards=len(self.store.shards),
                                        reject_kinds=dict(self.reject_kinds),
                                        reject_examples=list(self.reject_examples))
        if not self.store.done and not self.progress.c.rejected_by_endpoint:  # no prompt could be sent
            if uploader is not None:
                uploader.cancel()
            why = rejects_line(self.reject_kinds, self.reject_examples) if self.reject_kinds else "none"
            raise NoValidInput(
                f"no completion: {summary['rejected']} prompts rejected ({why}), "
                f"{summary['skipped_budget']} skipped by the token budget, none sent; the output is not "
                f"marked complete (rejects in {self.rejects.name})")
        manifest = self.store.manifest(complete=True, rejected=self.progress.c.rejected)
        self.store.write_manifest(manifest)
        if self.mirror is not None and uploader is not None:
            ok = await self.mirror.finish(manifest, Path(self.rejects.name), self.cfg.all_down_timeout_s)
            uploader.cancel()
            summary["s3_complete"] = ok
            if not ok:
                raise GenerateError(f"S3 {self.mirror.url()} did not take the uploads within "
                                    f"{self.cfg.all_down_timeout_s:.0f}s; every completion is spooled under "
                                    f"{self.store.out} and the next run uploads it")
        return summary
