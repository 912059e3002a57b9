#!/usr/bin/env python3
"""STAND-IN for `python -m sglang_router.launch_router`: module `sglang_router.launch_router` of the
stand-in `sglang-router` wheel that molecule/sglang and the lab install in place of the router.
Not the router.

The real router (sglang-router, a Rust wheel of ~30 MB plus aiohttp/fastapi/uvicorn) is what production
runs. The tests install this stdlib-only round-robin proxy under the same module name and version, so
the unit's production command line (--host, --port, --worker-urls, --policy, --api-key and the TLS
options below; any other argument is refused with exit 2, as the real router's argparse does), its
ordering and the readiness checks are exercised without installing it.

Paths, as the real router answers them (sgl-project/sglang, sgl-router/src/server.rs, `build_app`: the
`public_routes`, `protected_routes`, `admin_routes` and `worker_routes` routers, and `sink_handler` for
any other path; routers/http/router.rs for what each does; the open/keyed split as sglang-router 0.3.2
answered with --api-key in front of keyed SGLang 0.5.23 servers):

    path                                  key    answer
    /health, /liveness                    open   200 "OK" always, whatever the workers (server.rs
                                                 `health` is `liveness`): says only that the router runs
    /readiness                            open   200 {"status": "ready", "healthy_workers": N,
                                                 "total_workers": M} with at least one healthy worker,
                                                 else 503 {"status": "not ready", "reason":
                                                 "insufficient healthy workers"}
    /health_generate, /get_server_info,   open   proxied to a healthy worker (router.rs
    /get_model_info, /v1/models                  `proxy_get_request`), 503 without one
    /generate, /v1/chat/completions,      keyed  proxied to a healthy worker in turn, 503
    /v1/completions                              {"error": "no_available_workers"} without one
    /workers                              keyed  the workers: url, is_healthy (server.rs
                                                 `list_workers_rest`), and here `last_error`, the
                                                 reason of the last failed health check
    /list_workers                         keyed  {"urls": [...]} (server.rs `list_workers`)
    /server_info and any other path       -      404 (the router has no such route; SGLang's newer
                                                 /server_info exists only on the instances)

"keyed": with --api-key, a caller must send `Authorization: Bearer KEY`; one that sends none, or another
key, gets 401 and nothing is forwarded. The open paths answer without it, so systemd's and the role's
readiness checks need no key. The router sends its own --api-key to the workers (router_args.py: "the
api key used for the authorization with the worker"), so the open proxied paths answer 200 to anyone who
reaches the port, keyed instances behind it or not: /get_server_info then hands out an instance's server
info, which in SGLang 0.5.x holds the API key itself (api_key, launch_command, internal_states).

Worker health: the real router checks each worker's /health in the background (every
--health-check-interval-secs; a worker turns unhealthy after --health-failure-threshold failures in a
row and healthy again after --health-success-threshold successes) and routes only to healthy ones. The
stand-in checks every second and turns a worker unhealthy at its first failure and healthy at its first
success (faster, same states); each change is logged on stderr (the unit's journal) with the reason.

TLS as the real router takes it (sglang_router/router_args.py, the TLS/mTLS group): --tls-cert-path and
--tls-key-path make it serve HTTPS only (router.py: server_cert_path/server_key_path, the two together; the
stand-in refuses one without the other), and --ca-cert-paths names the CAs it verifies the workers'
certificates against, host name included (without it the stand-in uses the system's CAs). A worker whose
certificate does not verify is unhealthy, never used over an unverified connection: /readiness answers
503 when it was the only one, while /health still answers 200. The client-certificate options (mTLS) are
not taken.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="stand-in for sglang_router.launch_router (round-robin proxy)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--worker-urls", nargs="+", required=True)
    p.add_argument("--policy", default="round_robin")
    p.add_argument("--api-key", default="")
    p.add_argument("--tls-cert-path", default=None)
    p.add_argument("--tls-key-path", default=None)
    p.add_argument("--ca-cert-paths", nargs="*", default=[])
    a = p.parse_args(argv)
    if bool(a.tls_cert_path) != bool(a.tls_key_path):
        p.error("--tls-cert-path and --tls-key-path go together (the router serves HTTPS with both)")
    for path in [a.tls_cert_path, a.tls_key_path, *a.ca_cert_paths]:
        if path and not os.path.isfile(path):
            p.error(f"{path}: no such file")
    return a


def worker_context(ca_paths: list[str]) -> ssl.SSLContext:
    """How the router verifies the workers: against --ca-cert-paths, else the system's CAs."""
    ctx = ssl.create_default_context(cafile=ca_paths[0] if ca_paths else None)
    for path in ca_paths[1:]:
        ctx.load_verify_locations(cafile=path)
    return ctx


OPEN_PROXIED = ("/health_generate", "/get_server_info", "/get_model_info", "/v1/models")
KEYED_PROXIED = ("/generate", "/v1/chat/completions", "/v1/completions")
KEYED_LISTS = ("/workers", "/list_workers")


class Router:
    def __init__(self, workers: list[str], api_key: str, tls: ssl.SSLContext | None = None) -> None:
        self.workers = [w.rstrip("/") for w in workers]
        self.api_key = api_key
        self.tls = tls or worker_context([])
        self._cycle = itertools.cycle(range(len(self.workers)))
        self._lock = threading.Lock()
        # worker -> (healthy, reason of the last failed check); unhealthy until its first check answers
        self.health: dict[str, tuple[bool, str]] = dict.fromkeys(self.workers, (False, "not checked yet"))

    def check(self, worker: str) -> None:
        """One health check of `worker` (GET /health, verified TLS); logs a change of state."""
        try:
            with urllib.request.urlopen(worker + "/health", timeout=5, context=self.tls) as r:
                state = (r.status == 200, "" if r.status == 200 else f"/health: HTTP {r.status}")
        except urllib.error.HTTPError as e:
            state = (False, f"/health: HTTP {e.code}")
        except OSError as e:  # ssl.SSLCertVerificationError included
            state = (False, f"/health: {getattr(e, 'reason', None) or e}")
        with self._lock:
            before, self.health[worker] = self.health[worker], state
        if before != state:
            sys.stderr.write(f"router stand-in: worker {worker} "
                             f"{'healthy' if state[0] else 'unhealthy: ' + state[1]}\n")
            sys.stderr.flush()

    def wait_for_workers(self, timeout_s: float = 5.0) -> None:
        """At start, before it listens, the real router waits for its workers to answer (WorkerInitializer,
        up to --worker-startup-timeout-secs) and starts whatever they answered; the stand-in waits
        up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            for worker in self.workers:
                self.check(worker)
            if len(self.healthy()) == len(self.workers) or time.monotonic() > deadline:
                return
            time.sleep(0.2)

    def check_forever(self, interval_s: float = 1.0) -> None:
        while True:
            for worker in self.workers:
                self.check(worker)
            time.sleep(interval_s)

    def healthy(self) -> list[str]:
        with self._lock:
            return [w for w in self.workers if self.health[w][0]]

    def order(self) -> list[str]:
        with self._lock:
            start = next(self._cycle)
        rotated = self.workers[start:] + self.workers[:start]
        up = set(self.healthy())
        return [w for w in rotated if w in up]

    def listing(self) -> dict:
        with self._lock:
            workers = [{"url": w, "model_id": "unknown", "worker_type": "regular", "is_healthy": ok,
                        "last_error": why} for w, (ok, why) in self.health.items()]
        return {"workers": workers, "total": len(workers),
                "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(workers)}}


def make_handler(router: Router) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: object) -> None:
            pass

        def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: object) -> None:
            self._reply(code, json.dumps(obj).encode())

        def _route(self, method: str) -> None:
            path = self.path.split("?")[0]
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
            if method == "GET" and path in ("/health", "/liveness"):
                self._reply(200, b"OK", "text/plain")
            elif method == "GET" and path == "/readiness":
                up = router.healthy()
                if up:
                    self._json(200, {"status": "ready", "healthy_workers": len(up),
                                     "total_workers": len(router.workers)})
                else:
                    self._json(503, {"status": "not ready", "reason": "insufficient healthy workers"})
            elif method == "GET" and path in OPEN_PROXIED:
                self._forward(method, body)
            elif path in KEYED_PROXIED + KEYED_LISTS:
                if router.api_key and self.headers.get("Authorization") != f"Bearer {router.api_key}":
                    self._json(401, {"error": "Unauthorized"})
                elif path == "/workers" and method == "GET":
                    self._json(200, router.listing())
                elif path == "/list_workers" and method == "GET":
                    self._json(200, {"urls": router.workers})
                elif path in KEYED_PROXIED and method == "POST":
                    self._forward(method, body)
                else:
                    self._reply(405, b"")
            else:
                self._reply(404, b"")

        def _forward(self, method: str, body: bytes | None) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            if router.api_key:  # the router authenticates to the workers with its own key
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
                headers["Authorization"] = f"Bearer {router.api_key}"
            last = "no healthy worker"
            for worker in router.order():
                req = urllib.request.Request(worker + self.path, data=body, headers=headers, method=method)
                try:
                    with urllib.request.urlopen(req, timeout=3600, context=router.tls) as r:
                        self._reply(r.status, r.read(), r.headers.get("Content-Type", "application/json"))
                        return
                except urllib.error.HTTPError as e:
                    self._reply(e.code, e.read(), e.headers.get("Content-Type", "application/json"))
                    return
                except OSError as e:  # ssl.SSLCertVerificationError included: that worker is not used
                    last = f"{worker}: {getattr(e, 'reason', None) or e}"
                    sys.stderr.write(f"router stand-in: worker {last}\n")
                    sys.stderr.flush()
            self._json(503, {"error": "no_available_workers", "message": last})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    router = Router(args.worker_urls, args.api_key, worker_context(args.ca_cert_paths))
    router.wait_for_workers()
    threading.Thread(target=router.check_forever, daemon=True).start()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(router))
    server.daemon_threads = True
    scheme = "http"
    if args.tls_cert_path:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert_path, args.tls_key_path)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    workers = " ".join(args.worker_urls)
    sys.stderr.write(f"router stand-in on {scheme}://{args.host}:{args.port} -> {workers}\n")
    sys.stderr.flush()
    server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
