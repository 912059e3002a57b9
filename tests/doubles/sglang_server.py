#!/usr/bin/env python3
"""A TEST DOUBLE of an SGLang server (OpenAI-compatible HTTP API). It is not SGLang.

Why a double: the SGLang wheel cannot serve on CPU-only machines (sgl_kernel ships CUDA builds only), so
the generator's tests, the benchmarks and the lab containers (bare Debian, under systemd) use this
stand-in. It needs only the Python standard library:

    python3 tests/doubles/sglang_server.py --host 127.0.0.1 --port 30000 [--model NAME] [--latency S]
        [--tokens-per-s N] [--error-rate P] [--abort-rate P] [--die-after N] [--max-running N]
        [--max-running-unset] [--no-server-info] [--startup-s S] [--seed S]
        [--reasoning-parser qwen3] [--api-key KEY] [--context-length N]
        [--ssl-certfile PEM --ssl-keyfile PEM [--ssl-ca-certs PEM]]
        [--keep-alive-s S] [--log-requests] [--holds] [--model-dir DIR]

It serves SGLang's response shapes: GET /health, /health_generate, /get_model_info, /server_info (and its
deprecated alias /get_server_info), /v1/models and POST /v1/chat/completions (non-streaming). The
completion is a pure function of the request's messages (see `expected_completion`), so a client's
duplicates and losses are detectable: the answer starts with "Answer <key>:" where <key> is a digest of
the messages. One "token" is one word. A prompt containing EMPTY_THINKING ("[empty-thinking]") gets an
empty thinking and an answer with a stray "</think>" in it (what a real model sometimes writes).

Answers as real SGLang gives them (references are to sgl-project/sglang, python/sglang/srt/):
- `--reasoning-parser qwen3`: the thinking comes in `message.reasoning_content` and the answer in
  `message.content` (parser/reasoning_parser.py, `BaseReasoningFormatDetector._detect_and_parse_impl`:
  split at the first `</think>`; no `</think>` at all = everything is reasoning). serving_chat.py,
  `OpenAIServingChat._build_chat_response`, then writes `content=text if text else ""` and
  `reasoning_content=reasoning_text if reasoning_text else None`: an EMPTY thinking is `null` (not
  ""), and when `max_tokens` ends inside the thinking the content is `""` (not null), with
  finish_reason "length". Without the parser the thinking is inline as `<think>...</think>` in
  `content` and `reasoning_content` is null (protocol.py, `ChatMessage`: the field is always there).
- `--abort-rate P`: that share of completions ends with HTTP 200, finish_reason "abort" and the partial
  text decoded so far. SGLang does this for requests aborted by POST /abort_request, by
  /pause_generation in abort mode, by a weight update with abort_all_requests and on scheduler shutdown
  (managers/scheduler.py, `Scheduler.abort_request`: `req.to_finish = FINISH_ABORT()`); only aborts
  carrying status_code 400 / 500 / 503 become HTTP errors (managers/tokenizer_manager.py,
  `TokenizerManager._wait_one_response`), the others reach `_build_chat_response` as a normal answer
  whose finish_reason is `finish_reason["type"]` = "abort".
- /server_info (entrypoints/http_server.py, `server_info`; `get_server_info` is its deprecated alias)
  is the server args flattened (max_running_requests, reasoning_parser, dp_size, ...), the scheduler
  info, `internal_states` (one per DP rank, from the scheduler's get_internal_state, which sets
  `effective_max_running_requests_per_dp`) and `version`. `--max-running-unset` answers as a server
  started without --max-running-requests: `max_running_requests: null`, the effective value only in
  `internal_states[0].effective_max_running_requests_per_dp`. `--no-server-info` answers 404 on
  /server_info, as releases before it existed do.
- `--startup-s S`: for the first S seconds /health and /health_generate answer 503 (http_server.py,
  `health_generate`, which serves both: 503 while `server_status == ServerStatus.Starting` and while
  shutting down). Unknown paths answer 404 `{"detail": "Not Found"}` (FastAPI), so a client that puts
  `/v1` in front of /health gets 404.

Capacity: at most --max-running requests are decoded at once (the rest wait, as in SGLang's queue);
each takes --latency seconds plus completion_tokens / --tokens-per-s. --error-rate answers that share of
completions with HTTP 500; --die-after N makes the process exit right after its N-th completion (the
requests in flight then see their connection reset). GET /double/stats reports counters for tests;
with --log-requests, GET /double/requests lists every chat request's messages and max_tokens. With
--holds, a request whose last message contains "[hold-s=N]" takes N more seconds (tests use it to
shape idle gaps and to kill a client between the turns of a conversation).

Model mode: with `--model-dir DIR` the completion is what the model in DIR decodes for the request on
the CPU (transformers; see tests/doubles/sglang_model.py for SGLang's rules it follows), so `generate`
stores the target's own text; one request is decoded at a time, and the failure flags above still apply.

HTTPS as SGLang serves it: `--ssl-certfile` and `--ssl-keyfile` (SGLang's flags; --tls-cert/--tls-key are
older spellings of the same) make the server speak TLS only, with that certificate. The rules are SGLang's
(srt/arg_groups/serving_hook.py, `handle_ssl_validation`), with its messages: one of the two without the
other is refused, so is `--ssl-ca-certs` without both, and a file that does not exist. `--ssl-ca-certs`
is what SGLang verifies its own internal requests against (`ssl_verify_of`); the double makes none, so it
only checks the file.

Keep-alive as SGLang's HTTP server has it: uvicorn closes a connection that stays idle
`timeout_keep_alive` seconds after its last response, and SGLang sets that from
`SGLANG_TIMEOUT_KEEP_ALIVE = EnvInt(5)` (srt/environ.py; entrypoints/http_server.py passes it to
uvicorn.run). `--keep-alive-s S` (default 5, 0 = never) models the close at the moment a client loses
the race with it: a request that arrives on a connection idle longer than S is not answered and the
connection is closed, as when the request crosses the server's FIN on the wire. Counted as
`stale_closed` in /double/stats.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega", "draft",
    "target", "token", "layer", "block", "mask", "anchor", "verify", "accept", "reject",
]
ROLES = ("system", "user", "assistant", "tool", "developer")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EMPTY_THINKING = "[empty-thinking]"  # a prompt with this gets an empty thinking and a stray </think>
IM_END_ID = 151645  # Qwen's <|im_end|>, what SGLang reports as matched_stop
HOLD = re.compile(r"\[hold-s=([0-9.]+)\]")  # with --holds: extra service seconds for this request


def messages_key(messages: list[dict]) -> str:
    """Digest of the (role, content) turns of a request: the seed of its completion."""
    turns = [[str(m.get("role", "")), str(m.get("content", ""))] for m in messages]
    return hashlib.sha256(json.dumps(turns, ensure_ascii=False).encode()).hexdigest()[:16]


def expected_completion(messages: list[dict], enable_thinking: bool = True) -> tuple[str, str]:
    """(reasoning, answer) the double produces for `messages` when not truncated."""
    key = messages_key(messages)
    rng = random.Random(int(key, 16))
    think = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 60)))
    words = [rng.choice(WORDS) for _ in range(rng.randint(5, 40))]
    if any(EMPTY_THINKING in str(m.get("content", "")) for m in messages):
        # thinking closed right away; the answer itself mentions the tag (quotes it, explains it ...)
        words.insert(len(words) // 2, THINK_CLOSE)
        think = ""
    answer = f"Answer {key}: " + " ".join(words)
    return (f"Thinking {key}: {think}" if enable_thinking and think else ""), answer


def completion_tokens(messages: list[dict], enable_thinking: bool = True) -> list[str]:
    """The completion as a token list (thinking between the think tags, then the answer)."""
    reasoning, answer = expected_completion(messages, enable_thinking)
    head = [THINK_OPEN, *reasoning.split(), THINK_CLOSE] if enable_thinking else []
    return head + answer.split()


def prompt_token_count(messages: list[dict]) -> int:
    return sum(len(str(m.get("content", "")).split()) + 4 for m in messages) + 2


def render(tokens: list[str], enable_thinking: bool, parser: str) -> tuple[str, str | None, int]:
    """(content, reasoning_content, reasoning_tokens) of a (possibly truncated) token list."""
    if not enable_thinking:
        return " ".join(tokens), None, 0
    closed = THINK_CLOSE in tokens
    cut = tokens.index(THINK_CLOSE) if closed else len(tokens)  # the first </think>, as SGLang's parser
    reasoning = " ".join(tokens[1:cut])
    answer = " ".join(tokens[cut + 1:]) if closed else ""
    n_reasoning = cut + (1 if closed else 0)
    if parser == "qwen3":
        # serving_chat.py _build_chat_response: content "" (never null), empty reasoning -> null
        return answer, (reasoning or None), n_reasoning
    inline = f"{THINK_OPEN}\n{reasoning}\n" + (f"{THINK_CLOSE}\n\n{answer}" if closed else "")
    return inline, None, n_reasoning


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.slots = threading.BoundedSemaphore(args.max_running)
        self.lock = threading.Lock()
        self.rng = random.Random(args.seed)
        self.served = 0
        self.errors = 0
        self.aborted = 0
        self.running = 0
        self.max_seen_running = 0
        self.stale_closed = 0  # requests that arrived on a connection past its keep-alive
        self.requests: list[dict] = []  # with --log-requests: messages and max_tokens of each request
        self.sampling: dict = {}  # the sampling fields of the last completion request
        self.started = time.time()
        self.decoder = self.model_answer = None  # model mode (--model-dir)
        if args.model_dir:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import sglang_model

            self.decoder, self.model_answer = sglang_model.ModelDecoder(args.model_dir, args.seed), \
                sglang_model.answer


def error_body(code: int, message: str, kind: str) -> dict:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-double/0.1"
    state: State  # set on the class by main()

    def setup(self) -> None:
        super().setup()
        self.idle_since = time.monotonic()  # uvicorn's keep-alive timer also runs before the 1st request

    def _stale(self) -> bool:
        """The connection outlived the server's keep-alive: close it unanswered (see the docstring)."""
        keep = self.state.args.keep_alive_s
        if keep <= 0 or time.monotonic() - self.idle_since <= keep:
            return False
        with self.state.lock:
            self.state.stale_closed += 1
        self.close_connection = True
        return True

    def log_message(self, fmt: str, *args: object) -> None:
        if self.state.args.verbose:
            sys.stderr.write(f"{self.address_string()} - {fmt % args}\n")

    def _send(self, code: int, body: object, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        self.idle_since = time.monotonic()

    def _authorized(self) -> bool:
        key = self.state.args.api_key
        if not key or self.path.split("?")[0] in ("/health", "/health_generate", "/metrics"):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def server_info(self) -> dict:
        """http_server.py `server_info`: server args, scheduler info, internal_states, version."""
        a = self.state.args
        return {"model_path": a.model, "tokenizer_path": a.model, "served_model_name": a.model,
                "max_running_requests": None if a.max_running_unset else a.max_running,
                "context_length": a.context_length, "tp_size": 1, "dp_size": 1,
                "reasoning_parser": a.reasoning_parser or None, "max_total_num_tokens": 20480,
                "internal_states": [{
                    "effective_max_running_requests_per_dp": a.max_running, "last_gen_throughput": 0.0,
                    "memory_usage": {"weight": 1.0, "kvcache": 0.2, "token_capacity": 20480}}],
                "version": "double"}

    def do_GET(self) -> None:
        if self._stale() or not self._authorized():
            return
        a, path = self.state.args, self.path.split("?")[0]
        if path in ("/health", "/health_generate"):
            starting = time.time() - self.state.started < a.startup_s
            self._send(503 if starting else 200, b"", "text/plain")
        elif path == "/get_model_info":
            self._send(200, {"model_path": a.model, "tokenizer_path": a.model, "is_generation": True,
                             "preferred_sampling_params": None, "weight_version": "default"})
        elif path == "/get_server_info" or (path == "/server_info" and not a.no_server_info):
            self._send(200, self.server_info())
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": a.model, "object": "model", "created": int(self.state.started), "owned_by": "sglang",
                "root": a.model, "max_model_len": a.context_length}]})
        elif path == "/double/stats":
            s = self.state
            with s.lock:
                self._send(200, {"served": s.served, "errors": s.errors, "aborted": s.aborted,
                                 "running": s.running, "max_seen_running": s.max_seen_running,
                                 "sampling": s.sampling, "stale_closed": s.stale_closed})
        elif path == "/double/requests":
            with self.state.lock:
                self._send(200, {"requests": self.state.requests})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self._stale() or not self._authorized():
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.split("?")[0] != "/v1/chat/completions":
            self._send(404, {"detail": "Not Found"})
            return
        try:
            req = json.loads(raw)
        except ValueError as e:
            self._send(400, error_body(400, f"invalid JSON body: {e}", "BadRequestError"))
            return
        problem = validate(req)
        if problem:
            self._send(400, error_body(400, problem, "BadRequestError"))
            return
        self._complete(req)

    def _answer(self, req: dict, tokens: list[str], finish: str, n_prompt: int, thinking: bool) -> dict:
        a = self.state.args
        content, reasoning, n_reasoning = render(tokens, thinking, a.reasoning_parser)
        n_reasoning = min(n_reasoning, len(tokens))
        return {
            "id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": req.get("model") or a.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                 "reasoning_content": reasoning, "tool_calls": None},
                         "logprobs": None, "finish_reason": finish,
                         "matched_stop": IM_END_ID if finish == "stop" else None}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(tokens),
                      "total_tokens": n_prompt + len(tokens), "prompt_tokens_details": None,
                      "reasoning_tokens": n_reasoning},
            "metadata": {"weight_version": "default"},
        }

    def _complete(self, req: dict) -> None:
        s, a = self.state, self.state.args
        messages = req["messages"]
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or 4096
        thinking = bool((req.get("chat_template_kwargs") or {}).get("enable_thinking", True))
        n_prompt = prompt_token_count(messages)
        if n_prompt + max_tokens > a.context_length:
            self._send(400, error_body(400, (
                f"Requested token count exceeds the model's maximum context length of {a.context_length} "
                f"tokens. You requested a total of {n_prompt + max_tokens} tokens: {n_prompt} tokens from "
                f"the input messages and {max_tokens} tokens for the completion."), "BadRequestError"))
            return
        with s.lock:
            s.sampling = {k: req[k] for k in ("temperature", "top_p", "top_k", "min_p") if k in req}
            if a.log_requests:
                s.requests.append({"messages": messages, "max_tokens": max_tokens})
        if s.decoder is not None:  # model mode: the model in --model-dir writes the answer
            with s.slots:
                code, body = s.model_answer(s.decoder, req, a.model, a.reasoning_parser, a.context_length,
                                            max_tokens)
            with s.lock:
                s.served += code == 200
            self._send(code, body)
            return
        tokens = completion_tokens(messages, thinking)
        finish = "stop" if len(tokens) <= max_tokens else "length"
        tokens = tokens[:max_tokens]
        service = a.latency + (len(tokens) / a.tokens_per_s if a.tokens_per_s > 0 else 0.0)
        hold = HOLD.search(str(messages[-1].get("content", ""))) if a.holds else None
        service += float(hold.group(1)) if hold else 0.0
        with s.slots:
            # The service time is counted from admission and the answer is built while it runs, so the
            # double's own CPU (parsing, rendering, encoding) does not lengthen it: its capacity is exactly
            # max_running / service time, as the throughput benchmark assumes.
            admitted = time.monotonic()
            with s.lock:
                s.running += 1
                s.max_seen_running = max(s.max_seen_running, s.running)
                fail = a.error_rate > 0 and s.rng.random() < a.error_rate
                abort = not fail and a.abort_rate > 0 and s.rng.random() < a.abort_rate
                if abort:
                    s.aborted += 1
            if abort:  # aborted mid-decode: the partial text, HTTP 200, finish_reason "abort"
                tokens, finish = tokens[:max(1, len(tokens) // 2)], "abort"
            try:
                if fail:
                    code, body = 500, error_body(500, "Internal server error (injected by the SGLang double)",
                                                 "InternalServerError")
                else:
                    code, body = 200, self._answer(req, tokens, finish, n_prompt, thinking)
                data = json.dumps(body).encode()
                time.sleep(max(0.0, admitted + service - time.monotonic()))
            finally:
                with s.lock:
                    s.running -= 1
        if fail:
            with s.lock:
                s.errors += 1
            self._send(code, data)
            return
        self._send(code, data)
        with s.lock:
            s.served += 1
            dying = a.die_after > 0 and s.served >= a.die_after
        if dying:
            sys.stderr.write(f"sglang double: dying after {s.served} completions (--die-after)\n")
            os._exit(3)


def validate(req: object) -> str:
    """An SGLang-like 400 message for a malformed chat request, or ''."""
    if not isinstance(req, dict):
        return "request body must be a JSON object"
    if req.get("stream"):
        return "stream=true is not supported by the SGLang double"
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: field required (a non-empty list)"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return f"messages[{i}]: invalid role"
    mt = req.get("max_completion_tokens") or req.get("max_tokens")
    if mt is not None and (not isinstance(mt, int) or mt < 1):
        return f"max_tokens must be a positive integer, got {mt!r}"
    return ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SGLang test double (stdlib only; not SGLang)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="Qwen/Qwen3.6-27B")
    p.add_argument("--latency", type=float, default=0.0, help="seconds per request before decoding")
    p.add_argument("--tokens-per-s", type=float, default=0.0, help="decode speed per request (0 = instant)")
    p.add_argument("--error-rate", type=float, default=0.0, help="share of completions answered with 500")
    p.add_argument("--abort-rate", type=float, default=0.0,
                   help="share of completions aborted mid-decode (HTTP 200, finish_reason abort)")
    p.add_argument("--die-after", type=int, default=0, help="exit after this many completions (0 = never)")
    p.add_argument("--max-running", type=int, default=64, help="requests decoded at once")
    p.add_argument("--max-running-unset", action="store_true",
                   help="report max_running_requests null, the value only in internal_states")
    p.add_argument("--no-server-info", action="store_true", help="404 on /server_info (old releases)")
    p.add_argument("--startup-s", type=float, default=0.0, help="503 on /health for this long after start")
    p.add_argument("--context-length", type=int, default=262144)
    p.add_argument("--reasoning-parser", default="", choices=["", "qwen3"])
    p.add_argument("--api-key", default=os.environ.get("SGLANG_DOUBLE_API_KEY", ""),
                   help="require 'Authorization: Bearer KEY' (health exempt); default $SGLANG_DOUBLE_API_KEY")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ssl-certfile", "--tls-cert", default="",
                   help="serve HTTPS with this certificate (PEM) ...")
    p.add_argument("--ssl-keyfile", "--tls-key", default="", help="... and this key (PEM)")
    p.add_argument("--ssl-ca-certs", default="", help="CA of SGLang's own internal requests (checked only)")
    p.add_argument("--keep-alive-s", type=float, default=5.0,
                   help="idle seconds before a connection is closed (SGLANG_TIMEOUT_KEEP_ALIVE; 0 = never)")
    p.add_argument("--log-requests", action="store_true", help="keep every request for /double/requests")
    p.add_argument("--holds", action="store_true", help='honour "[hold-s=N]" in a request\'s last message')
    p.add_argument("--model-dir", default="",
                   help="decode with this model directory on the CPU (transformers) instead of the digest")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.max_running < 1:
        p.error("--max-running must be >= 1")
    for name in ("error_rate", "abort_rate"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            p.error(f"--{name.replace('_', '-')} must be within [0, 1]")
    why = ssl_refusal(args)
    if why:
        p.error(why)
    return args


def ssl_refusal(args: argparse.Namespace) -> str:
    """SGLang's refusal of these TLS arguments, word for word, or "" (srt/arg_groups/serving_hook.py,
    handle_ssl_validation, which raises ValueError before the model loads)."""
    if args.ssl_keyfile and not args.ssl_certfile:
        return "--ssl-keyfile requires --ssl-certfile to be specified as well."
    if args.ssl_certfile and not args.ssl_keyfile:
        return "--ssl-certfile requires --ssl-keyfile to be specified as well."
    if not args.ssl_certfile and args.ssl_ca_certs:
        return "--ssl-ca-certs has no effect without --ssl-certfile and --ssl-keyfile."
    if args.ssl_keyfile and not os.path.isfile(args.ssl_keyfile):
        return f"SSL key file not found: '{args.ssl_keyfile}'. Please check the --ssl-keyfile path."
    if args.ssl_certfile and not os.path.isfile(args.ssl_certfile):
        return f"SSL certificate file not found: '{args.ssl_certfile}'. Please check the --ssl-certfile path."
    if args.ssl_ca_certs and not os.path.isfile(args.ssl_ca_certs):
        return (f"SSL CA certificates file not found: '{args.ssl_ca_certs}'. "
                "Please check the --ssl-ca-certs path.")
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Handler.state = State(args)
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    scheme = "http"
    if args.ssl_certfile:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    sys.stderr.write(f"sglang double serving {args.model} on {scheme}://{args.host}:{args.port}\n")
    sys.stderr.flush()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
