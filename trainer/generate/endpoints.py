"""One OpenAI-compatible endpoint (an SGLang instance or the router): its window, health and backoff,
plus the request body and the parsing of SGLang's chat-completion answers."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import ssl
from typing import Any

import httpcore
import httpx

from trainer.generate.config import GenerateConfig

log = logging.getLogger("trainer.generate")


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """One verified TLS context for every client (building one reads the CA bundle: ~0.1 s)."""
    return httpx.create_ssl_context()


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    status_code: int
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


# what a request can raise when the endpoint (not the prompt) is at fault
TIMEOUT_ERRORS = (httpx.TimeoutException, httpcore.TimeoutException)
TRANSPORT_ERRORS = (httpx.TransportError, httpcore.NetworkError, httpcore.ProtocolError,
                    httpcore.ProxyError, httpcore.UnsupportedProtocol)


class FatalEndpointError(RuntimeError):
    """The endpoint refuses us for good (401/403/404): a configuration error, not an outage."""


@dataclasses.dataclass(slots=True)
class Completion:
    content: str
    reasoning: str
    finish_reason: str
    usage: dict[str, Any]

    @property
    def flag(self) -> str:
        """'' for a usable completion, else why it is suspect ('length', 'empty')."""
        if self.finish_reason == "length":
            return "length"
        return "" if self.content.strip() else "empty"


def split_reasoning(content: str, reasoning: str | None) -> tuple[str, str]:
    """(answer, thinking): SGLang's reasoning_content when present, else inline <think>...</think>."""
    if reasoning is not None:
        return content, reasoning
    if "<think>" in content:
        pre, _, rest = content.partition("<think>")
        think, closed, answer = rest.partition("</think>")
        if not closed:  # the budget ended inside the thinking
            return pre.strip(), think.strip()
        return (pre + answer).strip(), think.strip()
    if "</think>" in content:  # the chat template opened <think> in the prompt
        think, _, answer = content.partition("</think>")
        return answer.strip(), think.strip()
    return content, ""


def parse_completion(data: Any) -> Completion:
    """An SGLang /v1/chat/completions body -> Completion; ValueError names what is missing."""
    try:
        choice = data["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"no choices[0].message in the response ({e!r})") from None
    content = msg.get("content") or ""
    if not isinstance(content, str):
        raise ValueError(f"choices[0].message.content is {type(content).__name__}, not a string")
    answer, thinking = split_reasoning(content, msg.get("reasoning_content"))
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return Completion(answer, thinking, str(choice.get("finish_reason") or ""), usage)


class Endpoint:
    """An endpoint's state. `capacity` is its window: requests in flight at once."""

    def __init__(self, url: str, cfg: GenerateConfig, api_key: str = "") -> None:
        self.url = url.rstrip("/")
        self.cfg = cfg
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.capacity = cfg.concurrency or cfg.default_concurrency
        self._ssl = ssl_context()
        self.client = self._new_client()  # health probes
        self._free: list[httpcore.AsyncConnectionPool] = []  # one keep-alive connection per window slot
        self._post_headers = [(b"Content-Type", b"application/json"),
                              *((k.encode(), v.encode()) for k, v in self.headers.items())]
        self._timeouts = {"connect": cfg.connect_timeout_s, "read": cfg.request_timeout_s,
                          "write": cfg.connect_timeout_s, "pool": cfg.connect_timeout_s}
        self.up = False
        self.disabled = ""  # reason, when FatalEndpointError put it out for the run
        self.down_reason = "not probed yet"
        self.backoff = 0.0
        self.consecutive_failures = 0
        self.inflight = 0
        self.tasks: set[asyncio.Task] = set()
        self.completed = 0
        self.errors = 0
        self.downs = 0
        self.tokens_out = 0

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers=self.headers, verify=self._ssl,
            timeout=httpx.Timeout(self.cfg.request_timeout_s, connect=self.cfg.connect_timeout_s),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )

    async def post(self, path: str, body: dict[str, Any]) -> Reply:
        """POST on a slot's own keep-alive connection (httpcore, without httpx's per-request URL, cookie
        and header machinery, and without a shared pool that scans every connection on each request:
        at a window of 64+ both cost more CPU than the request itself)."""
        conn = self._free.pop() if self._free else httpcore.AsyncConnectionPool(
            ssl_context=self._ssl, max_connections=1, max_keepalive_connections=1)
        try:
            r = await conn.request("POST", self.url + path, headers=self._post_headers,
                                   content=json.dumps(body).encode(), extensions={"timeout": self._timeouts})
        except BaseException:
            await conn.aclose()  # its connection may be half-used: never reuse it
            raise
        self._free.append(conn)
        return Reply(r.status, r.content)

    @property
    def load(self) -> float:
        return self.inflight / self.capacity

    def free(self) -> bool:
        return self.up and self.inflight < self.capacity

    async def probe(self) -> bool:
        """GET /health; then (with concurrency 0) the window from /get_server_info's max_running_requests."""
        try:
            r = await self.client.get("/health", timeout=self.cfg.connect_timeout_s)
        except httpx.HTTPError as e:
            self.down_reason = f"/health: {type(e).__name__}: {e}"
            return False
        if r.status_code in (401, 403):
            raise FatalEndpointError(
                f"{self.url}/health: HTTP {r.status_code} (check ${self.cfg.api_key_env})")
        if r.status_code != 200:
            self.down_reason = f"/health: HTTP {r.status_code}"
            return False
        if not self.cfg.concurrency:
            self.capacity = await self._server_capacity()
        return True

    async def _server_capacity(self) -> int:
        try:
            r = await self.client.get("/get_server_info", timeout=self.cfg.connect_timeout_s)
            value = r.json().get("max_running_requests") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            value = None
        if isinstance(value, int) and value > 0:
            return value
        log.info("%s: no max_running_requests in /get_server_info; window %d (generate.default_concurrency)",
                 self.url, self.cfg.default_concurrency)
        return self.cfg.default_concurrency

    def mark_down(self, reason: str) -> bool:
        """Put the endpoint aside; True when it was up (the caller then starts its recovery)."""
        self.down_reason = reason
        self.consecutive_failures = 0
        if not self.up:
            return False
        self.up = False
        self.downs += 1
        self.drop_connections()
        self.backoff = min(self.cfg.backoff_max_s, self.backoff * 2 or self.cfg.backoff_initial_s)
        log.warning("endpoint %s put aside for %.0fs: %s (%d requests in flight re-queued)",
                    self.url, self.backoff, reason, self.inflight)
        return True

    async def recover(self) -> None:
        """Wait out the backoff, probe /health, and double the backoff until it answers."""
        while not self.up and not self.disabled:
            await asyncio.sleep(self.backoff)
            try:
                ok = await self.probe()
            except FatalEndpointError as e:
                self.disabled = str(e)
                log.error("endpoint %s disabled for this run: %s", self.url, e)
                return
            if ok:
                self.up = True
                log.info("endpoint %s healthy again (window %d)", self.url, self.capacity)
                return
            self.backoff = min(self.cfg.backoff_max_s, self.backoff * 2 or self.cfg.backoff_initial_s)

    def describe(self) -> str:
        if self.disabled:
            return f"{self.url} disabled"
        if not self.up:
            return f"{self.url} down ({self.down_reason})"
        return f"{self.url} {self.inflight}/{self.capacity}"

    async def aclose(self) -> None:
        for client in [self.client, *self._free]:
            await client.aclose()
        self._free.clear()

    def drop_connections(self) -> None:
        """Forget the idle connections (after an outage they point at a dead server)."""
        old, self._free = self._free, []
        for client in old:
            asyncio.get_running_loop().create_task(client.aclose())

    def stats(self) -> dict[str, Any]:
        return {"completed": self.completed, "errors": self.errors, "downs": self.downs,
                "tokens_out": self.tokens_out, "capacity": self.capacity,
                "state": "disabled" if self.disabled else ("up" if self.up else "down")}
