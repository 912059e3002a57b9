"""One OpenAI-compatible endpoint (an SGLang instance or the router): its window, health and backoff,
plus the request body and the parsing of SGLang's chat-completion answers."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import json
import logging
import os
import ssl
import urllib.parse
from typing import Any

import aiohttp

from trainer.config_yaml import ConfigError
from trainer.generate.config import GenerateConfig

log = logging.getLogger("trainer.generate")


@functools.cache
def ssl_context(ca_file: str = "") -> ssl.SSLContext:
    """One verified TLS context for every endpoint: the system's CA store (SSL_CERT_FILE / SSL_CERT_DIR
    point it at a private CA), or with `ca_file` (generate.ca_file) that CA only; building one reads the
    bundle, so it is built once."""
    if not ca_file:
        return ssl.create_default_context()
    if not os.path.isfile(ca_file):
        raise ConfigError(f"generate.ca_file: {ca_file!r} is not a file (the CA certificate, PEM, that "
                          "signed the endpoints' certificates)")
    try:
        return ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError as e:
        raise ConfigError(f"generate.ca_file: {ca_file!r} holds no usable CA certificate (PEM): {e}"
                          ) from None


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
# (timeouts first: aiohttp's ServerTimeoutError is both a TimeoutError and a ClientError)
TIMEOUT_ERRORS = (TimeoutError,)
TRANSPORT_ERRORS = (aiohttp.ClientError,)
# a pooled connection that the server closed while it sat idle: the request fails before any byte of
# an answer (the server dropped it unread); it is worth one retry on a fresh connection
STALE_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class FatalEndpointError(RuntimeError):
    """The endpoint refuses us for good (401/403/404): a configuration error, not an outage."""


class TLSVerifyError(FatalEndpointError):
    """The endpoint's certificate does not verify against the CA we trust: a configuration error (the
    wrong generate.ca_file, or none), never an outage to wait out for all_down_timeout_s."""


def trusted_ca(ca_file: str) -> str:
    """What https:// endpoints are verified against, in words (for the error that names it)."""
    if ca_file:
        return f"generate.ca_file {ca_file}"
    env = [f"{k}={os.environ[k]}" for k in ("SSL_CERT_FILE", "SSL_CERT_DIR") if os.environ.get(k)]
    return f"the system's CA store ({'; '.join([*env, 'generate.ca_file is unset'])})"


def _name(der: bytes) -> str:
    """The issuer of a DER certificate as RFC 4514 text ('' when it cannot be read)."""
    try:
        from cryptography import x509

        return x509.load_der_x509_certificate(der).issuer.rfc4514_string()
    except ImportError:
        pass
    except ValueError:
        return ""
    import tempfile

    # without `cryptography`: the ssl module's own decoder (the one SSLSocket.getpeercert uses) reads
    # a PEM file
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(ssl.DER_cert_to_PEM_cert(der))
        f.flush()
        try:
            decoded = ssl._ssl._test_decode_cert(f.name)  # type: ignore[attr-defined]
        except (ssl.SSLError, OSError):
            return ""
    short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
             "localityName": "L", "stateOrProvinceName": "ST", "domainComponent": "DC"}
    return ",".join(f"{short.get(k, k)}={v}" for rdn in reversed(decoded.get("issuer", ())) for k, v in rdn)


async def peer_issuer(url: str, timeout_s: float) -> str:
    """The issuer of the certificate an https:// endpoint presents, read over a connection that does
    not verify it and sends nothing but the TLS handshake (only to name it in the error)."""
    parts = urllib.parse.urlsplit(url)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port or 443, ssl=ctx,
                                    server_hostname=parts.hostname), timeout_s)
    except (OSError, TimeoutError, ssl.SSLError) as e:
        return f"(not read: {type(e).__name__}: {e})"
    try:
        obj = writer.get_extra_info("ssl_object")
        der = obj.getpeercert(binary_form=True) if obj is not None else None
        return (_name(der) or "(unreadable)") if der else "(no certificate)"
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


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


def split_reasoning(content: str, reasoning: str | None,
                    server_parses_reasoning: bool | None = None) -> tuple[str, str]:
    """(answer, thinking): SGLang's reasoning_content when present, else inline <think>...</think>.

    `server_parses_reasoning` is what the endpoint's /server_info said about its `reasoning_parser`
    (None: it did not say). When the server's parser has run, a null reasoning_content is an empty
    thinking (serving_chat.py, _build_chat_response: `reasoning_text if reasoning_text else None`) and the
    content is the answer as given: a `</think>` inside it is the model's text, not a tag to split at.
    """
    if reasoning is not None:
        return content, reasoning
    if server_parses_reasoning:
        return content, ""
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


def parse_completion(data: Any, server_parses_reasoning: bool | None = None) -> Completion:
    """An SGLang /v1/chat/completions body -> Completion; ValueError names what is missing."""
    try:
        choice = data["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"no choices[0].message in the response ({e!r})") from None
    content = msg.get("content") or ""
    if not isinstance(content, str):
        raise ValueError(f"choices[0].message.content is {type(content).__name__}, not a string")
    answer, thinking = split_reasoning(content, msg.get("reasoning_content"), server_parses_reasoning)
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return Completion(answer, thinking, str(choice.get("finish_reason") or ""), usage)


def window_from_server_info(info: Any) -> tuple[int | None, str]:
    """(window, why) from an SGLang /server_info body; window None when the body does not say.

    http_server.py `server_info` returns the server args flattened (max_running_requests, dp_size ...)
    and `internal_states`, one per DP rank, where the scheduler reports the value it actually uses
    (`effective_max_running_requests_per_dp`): a server started without --max-running-requests reports
    the argument as null and only the effective value there.
    """
    if not isinstance(info, dict):
        return None, f"not a JSON object ({type(info).__name__})"
    value = info.get("max_running_requests")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, f"max_running_requests {value}"
    states = info.get("internal_states")
    per_dp = states[0].get("effective_max_running_requests_per_dp") if (
        isinstance(states, list) and states and isinstance(states[0], dict)) else None
    dp = info.get("dp_size")
    dp = dp if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0 else 1
    if isinstance(per_dp, int) and not isinstance(per_dp, bool) and per_dp > 0:
        arg = "null" if value is None else repr(value)
        why = f"max_running_requests is {arg}, internal_states[0].effective_max_running_requests_per_dp"
        return per_dp * dp, f"{why} {per_dp} x dp_size {dp}"
    return None, "neither max_running_requests nor internal_states[0].effective_max_running_requests_per_dp"


def seconds(s: float) -> str:
    """A duration for a log line: '0.2s', '1.6s', '60s' (never '0s' for a sub-second backoff)."""
    return f"{round(s, 1):g}s"


def base_url(url: str) -> str:
    """The server's root for an endpoint URL: OpenAI clients write `http://host:30000/v1`, SGLang serves
    /health and /server_info at the root and the chat API under /v1."""
    url = url.rstrip("/")
    return url[:-len("/v1")] if url.endswith("/v1") else url


def plain_http_key_refusal(cfg: GenerateConfig, api_key: str) -> str | None:
    """Why sending the API key to these endpoints is refused, or None: a key goes to an http:// URL of a
    host other than loopback (localhost, 127.0.0.0/8, ::1) only when generate.allow_plain_http_key says
    so; https:// and loopback are always fine."""
    if not api_key or cfg.allow_plain_http_key:
        return None
    plain = []
    for url in cfg.endpoints:
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme != "http" or host == "localhost":
            continue
        try:
            if ipaddress.ip_address(host).is_loopback:
                continue
        except ValueError:
            pass  # a name other than localhost: not known to be loopback
        plain.append(url)
    if not plain:
        return None
    return (f"generate.endpoints: refusing to send the API key (${cfg.api_key_env}) over plain HTTP to "
            f"{', '.join(plain)}: anyone on the network path can read it. Serve the endpoints over https://, "
            f"or set generate.allow_plain_http_key: true for a private network you trust")


class Endpoint:
    """An endpoint's state. `capacity` is its window: requests in flight at once; `window_reason` says
    where it came from. `parses_reasoning`: the server runs a reasoning parser (True), does not (False),
    or did not say (None)."""

    # /server_info is the current name; 0.5.x logs /get_server_info as deprecated, older releases have
    # only /get_server_info
    INFO_PATHS = ("/server_info", "/get_server_info")

    def __init__(self, url: str, cfg: GenerateConfig, api_key: str = "") -> None:
        self.url = url.rstrip("/")
        self.base = base_url(url)
        self.cfg = cfg
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.capacity = cfg.concurrency or cfg.default_concurrency
        self.window_reason = "generate.concurrency" if cfg.concurrency else "not probed yet"
        self.parses_reasoning: bool | None = None
        self._session: aiohttp.ClientSession | None = None  # made in the event loop, on first use
        self._fresh: aiohttp.ClientSession | None = None  # one new connection per request (retries)
        self._timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s,
                                              sock_connect=cfg.connect_timeout_s,
                                              sock_read=cfg.request_timeout_s)
        self._probe_timeout = aiohttp.ClientTimeout(total=cfg.connect_timeout_s)
        self._closing: set[asyncio.Task] = set()
        # built here, before any request, so that a bad generate.ca_file stops the stage at once
        self._tls: ssl.SSLContext | bool = ssl_context(cfg.ca_file) if self.url.startswith("https:") else True
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
        self.stale_retries = 0  # requests retried on a fresh connection (see `post`)

    def _new_session(self, **connector: Any) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ssl=self._tls, **connector),
                                     headers=self.headers, timeout=self._timeout, raise_for_status=False)

    def session(self) -> aiohttp.ClientSession:
        """The endpoint's keep-alive pool (aiohttp: C-accelerated HTTP parsing, ~0.6 ms of client CPU per
        completion against ~1.7 ms with httpx/httpcore). No connection limit: the window is the limit.
        A connection idle for `generate.keepalive_s` is not reused: that must stay below the server's
        own keep-alive (SGLang closes idle connections after SGLANG_TIMEOUT_KEEP_ALIVE, 5 s), or a
        request may go out on a connection the server is closing."""
        if self._session is None or self._session.closed:
            self._session = self._new_session(keepalive_timeout=self.cfg.keepalive_s)
        return self._session

    def fresh_session(self) -> aiohttp.ClientSession:
        """A session that opens a new connection for every request and closes it after."""
        if self._fresh is None or self._fresh.closed:
            self._fresh = self._new_session(force_close=True)
        return self._fresh

    async def post(self, path: str, body: dict[str, Any]) -> Reply:
        """POST a JSON body; the whole answer is read (non-streaming). A cancelled request's connection
        is closed, never reused. A request that fails before any byte of the answer on a pooled
        connection (the server closed it while idle) is sent once more on a fresh connection; what
        that one raises is the caller's to judge."""
        data = json.dumps(body).encode()
        answered = False
        try:
            async with self.session().post(self.base + path, data=data,
                                           headers={"Content-Type": "application/json"}) as r:
                answered = True
                return Reply(r.status, await r.read())
        except STALE_ERRORS as e:
            if answered or isinstance(e, aiohttp.ClientConnectorError):
                raise  # an answer was under way, or no connection could be made at all
        self.stale_retries += 1
        async with self.fresh_session().post(self.base + path, data=data,
                                             headers={"Content-Type": "application/json"}) as r:
            return Reply(r.status, await r.read())

    async def health_ok(self) -> bool:
        """GET /health on a fresh connection: does the server itself answer (after a request failed)?"""
        try:
            async with self.fresh_session().get(self.base + "/health", timeout=self._probe_timeout) as r:
                await r.read()
                return r.status == 200
        except TRANSPORT_ERRORS + TIMEOUT_ERRORS:
            return False

    @property
    def load(self) -> float:
        return self.inflight / self.capacity

    def free(self) -> bool:
        return self.up and self.inflight < self.capacity

    async def probe(self) -> bool:
        """GET /health (503 while SGLang starts: down, probed again); then the server info: the reasoning
        parser and (with concurrency 0) the window. 401/403/404 raise FatalEndpointError: a wrong key or
        a URL that is no SGLang server is a configuration error, not an outage to wait out."""
        try:
            status, _ = await self._get("/health")
        except aiohttp.ClientConnectorCertificateError as e:
            await self._tls_refused(e)
        except TRANSPORT_ERRORS + TIMEOUT_ERRORS as e:
            self.down_reason = f"/health: {type(e).__name__}: {e}"
            return False
        if status in (401, 403):
            raise FatalEndpointError(
                f"{self.base}/health: HTTP {status} (check ${self.cfg.api_key_env})")
        if status == 404:
            raise FatalEndpointError(
                f"{self.base}/health: HTTP 404: no SGLang server at {self.url} (generate.endpoints takes "
                f"the server's base URL, http://HOST:PORT or http://HOST:PORT/v1)")
        if status != 200:
            self.down_reason = f"/health: HTTP {status}"
            return False
        await self._read_server_info()
        return True

    async def _tls_refused(self, e: aiohttp.ClientConnectorCertificateError) -> None:
        """Raise TLSVerifyError naming the endpoint, what it was verified against and who issued its
        certificate (the usual cause: generate.ca_file names another CA than the one that signed it)."""
        cert_error = e.certificate_error
        why = getattr(cert_error, "verify_message", "") or str(cert_error)
        issuer = await peer_issuer(self.base, self.cfg.connect_timeout_s)
        raise TLSVerifyError(
            f"{self.base}: TLS certificate verification failed ({why}): verified against "
            f"{trusted_ca(self.cfg.ca_file)}; the server's certificate was issued by {issuer}. Set "
            f"generate.ca_file to the CA certificate (PEM) that signed it") from None

    async def _get(self, path: str) -> tuple[int, bytes]:
        async with self.session().get(self.base + path, timeout=self._probe_timeout) as r:
            return r.status, await r.read()

    async def _read_server_info(self) -> None:
        info: Any = None
        tried = []
        for path in self.INFO_PATHS:
            try:
                status, content = await self._get(path)
                if status == 200:
                    info = json.loads(content)
                    break
                tried.append(f"{path}: HTTP {status}")
            except (*TRANSPORT_ERRORS, *TIMEOUT_ERRORS, ValueError) as e:
                tried.append(f"{path}: {type(e).__name__}: {e}")
        self._learn_reasoning_parser(info)
        if self.cfg.concurrency:
            self.capacity, self.window_reason = self.cfg.concurrency, "generate.concurrency"
            return
        window, why = window_from_server_info(info) if info is not None else (None, "; ".join(tried))
        if window is not None:
            self.capacity, self.window_reason = window, f"{path}: {why}"
            return
        self.capacity = self.cfg.default_concurrency
        self.window_reason = f"generate.default_concurrency: the server did not say ({why})"
        log.warning("endpoint %s: window %d from generate.default_concurrency: the server did not say its "
                    "capacity (%s); set generate.concurrency to choose it", self.url, self.capacity, why)

    def _learn_reasoning_parser(self, info: Any) -> None:
        """Whether the server splits the thinking off itself: its server info says (an instance), else
        the run file's generate.reasoning_parser (the router, whose info does not say). Both saying and
        disagreeing is a configuration error: the stored answers would depend on the path taken."""
        said = self.cfg.reasoning_parser
        configured = None if not said else said != "none"
        if isinstance(info, dict) and "reasoning_parser" in info:
            runs = info["reasoning_parser"] or ""
            if configured is not None and bool(runs) != configured:
                raise FatalEndpointError(
                    f"{self.base}: generate.reasoning_parser is {said!r} but the server runs "
                    f"{runs or 'none'!r} (its server info, reasoning_parser); make them agree, or leave "
                    f"generate.reasoning_parser empty to take the server's word")
            self.parses_reasoning = bool(runs)
        elif configured is not None:
            self.parses_reasoning = configured
        elif self.cfg.enable_thinking and self.parses_reasoning is None:
            log.warning("endpoint %s: its server info does not say whether SGLang runs a reasoning parser "
                        "(the router's does not); an answer without reasoning_content is split at its "
                        "first </think>. Set generate.reasoning_parser to the instances' parser (or none) "
                        "to store answers as a direct connection does", self.url)

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
        log.warning("endpoint %s put aside for %s: %s (%d requests in flight re-queued)",
                    self.url, seconds(self.backoff), reason, self.inflight)
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
                log.info("endpoint %s: healthy, window %d (%s)", self.url, self.capacity, self.window_reason)
                return
            self.backoff = min(self.cfg.backoff_max_s, self.backoff * 2 or self.cfg.backoff_initial_s)

    def describe(self) -> str:
        if self.disabled:
            return f"{self.url} disabled"
        if not self.up:
            return f"{self.url} down ({self.down_reason})"
        return f"{self.url} {self.inflight}/{self.capacity}"

    async def aclose(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    def drop_connections(self) -> None:
        """Forget the pooled connections (after an outage they point at a dead server); the next request
        opens a fresh pool. The requests in flight on the old one are being cancelled by the caller."""
        for old in (self._session, self._fresh):
            if old is not None:
                task = asyncio.get_running_loop().create_task(old.close())
                self._closing.add(task)  # the loop holds tasks weakly
                task.add_done_callback(self._closing.discard)
        self._session = self._fresh = None

    def stats(self) -> dict[str, Any]:
        return {"completed": self.completed, "errors": self.errors, "downs": self.downs,
                "stale_retries": self.stale_retries,
                "tokens_out": self.tokens_out, "capacity": self.capacity, "window": self.window_reason,
                "state": "disabled" if self.disabled else ("up" if self.up else "down")}
