#!/usr/bin/env python3
"""STAND-IN for `python -m sglang_router.launch_router`: module `sglang_router.launch_router` of the
stand-in `sglang-router` wheel that molecule/sglang and the lab install in place of the router.
Not the router.

The real router (sglang-router, a Rust wheel of ~30 MB plus aiohttp/fastapi/uvicorn) is what production
runs. The tests install this stdlib-only round-robin proxy under the same module name and version, so
the unit's production command line (--host, --port, --worker-urls, --policy, --api-key and the TLS
options below; any other argument is refused with exit 2, as the real router's argparse does), its
ordering and the readiness check are exercised without installing it. /health answers 200 when at least
one worker answers /health; requests are forwarded to the workers in turn, skipping those that fail to
connect.

TLS as the real router takes it (sglang_router/router_args.py, the TLS/mTLS group): --tls-cert-path and
--tls-key-path make it serve HTTPS only (router.py: server_cert_path/server_key_path, the two together; the
stand-in refuses one without the other), and --ca-cert-paths names the CAs it verifies the workers'
certificates against, host name included (without it the stand-in uses the system's CAs). A worker whose
certificate does not verify is an error, never a fallback to an unverified connection: the request goes
to the next worker, and with none left the router answers 503 naming the verification failure (so does
/health, and the unit's readiness probe fails). The client-certificate options (mTLS) are not taken.

With --api-key, a caller must send `Authorization: Bearer KEY`, as the real router's auth middleware
requires: one that sends none, or another key, gets 401 and nothing is forwarded. Only the health
probes (/health, /liveness, /readiness) are open, so that systemd's readiness check needs no key.
"""

from __future__ import annotations

import argparse
import itertools
import os
import ssl
import sys
import threading
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


class Router:
    def __init__(self, workers: list[str], api_key: str, tls: ssl.SSLContext | None = None) -> None:
        self.workers = [w.rstrip("/") for w in workers]
        self.api_key = api_key
        self.tls = tls or worker_context([])
        self._cycle = itertools.cycle(range(len(self.workers)))
        self._lock = threading.Lock()

    def order(self) -> list[str]:
        with self._lock:
            start = next(self._cycle)
        return self.workers[start:] + self.workers[:start]


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

        def _forward(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            open_path = self.path.split("?")[0] in ("/health", "/liveness", "/readiness")
            if (
                router.api_key
                and not open_path
                and headers.get("Authorization") != f"Bearer {router.api_key}"
            ):
                self._reply(401, b'{"error": "Unauthorized"}')
                return
            last = "no worker"
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
            self._reply(503, f'{{"error": "no worker reachable ({last})"}}'.encode())

        def do_GET(self) -> None:
            self._forward("GET")

        def do_POST(self) -> None:
            self._forward("POST")

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    router = Router(args.worker_urls, args.api_key, worker_context(args.ca_cert_paths))
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
