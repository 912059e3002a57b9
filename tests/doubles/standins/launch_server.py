#!/usr/bin/env python3
"""STAND-IN for `python -m sglang.launch_server`: module `sglang.launch_server` of the stand-in `sglang`
wheel that molecule/sglang and the lab install in place of SGLang. It is not SGLang.

SGLang is an 11 GB install that cannot serve on a CPU-only machine, so the tests install a small wheel
named `sglang` at the pinned version (sglang_standin_wheels.py builds it) with uv, exactly as role sglang
installs the real one, and the unit runs the production command `VENV/bin/python -m sglang.launch_server`.
This module takes the launch_server arguments role sglang emits and, like SGLang's ServerArgs
(python/sglang/srt/server_args.py, argparse), refuses any other with exit 2. It maps what the SGLang
double understands and serves the double (`_double.py` in the same package, a copy of
tests/doubles/sglang_server.py) in this process, as SGLang's launch_server serves its HTTP API from its
own process: the API key stays in memory, in no command line and no environment. Arguments the double
has no use for (--tp-size, --mem-fraction-static) are accepted and have no effect.

TLS: --ssl-certfile, --ssl-keyfile and --ssl-ca-certs (SGLang's names, server_args.py) go to the double,
which serves HTTPS with them and refuses them as SGLang does (srt/arg_groups/serving_hook.py,
handle_ssl_validation: one of certificate and key without the other, the CA without both, a missing file).

Test switch: `--standin-never-healthy` serves 503 on every path forever, so the role's readiness
timeout (and its message naming the instance + journal tail) can be tested.
"""

from __future__ import annotations

import argparse
import importlib.util
import ssl
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

DOUBLE = Path(__file__).with_name("_double.py")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="stand-in for sglang.launch_server (runs the SGLang double)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name", default="")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key", default="")
    p.add_argument("--reasoning-parser", default="")
    p.add_argument("--context-length", type=int, default=0)
    p.add_argument("--max-running-requests", type=int, default=0)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--ssl-certfile", default="")
    p.add_argument("--ssl-keyfile", default="")
    p.add_argument("--ssl-ca-certs", default="")
    p.add_argument("--standin-never-healthy", action="store_true")
    return p.parse_args(argv)


def double_argv(a: argparse.Namespace) -> list[str]:
    """The SGLang double's command line for these launch_server arguments."""
    argv = [
        sys.executable,
        str(DOUBLE),
        "--host",
        a.host,
        "--port",
        str(a.port),
        "--model",
        a.served_model_name or a.model_path,
    ]
    if a.reasoning_parser:
        argv += ["--reasoning-parser", a.reasoning_parser]
    if a.context_length:
        argv += ["--context-length", str(a.context_length)]
    if a.max_running_requests:
        argv += ["--max-running", str(a.max_running_requests)]
    for flag in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        if getattr(a, flag):
            argv += ["--" + flag.replace("_", "-"), getattr(a, flag)]
    return argv


class Unhealthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, fmt: str, *args: object) -> None:
        pass  # keep the journal tail on the startup line, not on the probes


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.standin_never_healthy:
        sys.stderr.write(f"sglang stand-in: port {args.port} will never become healthy (test switch)\n")
        sys.stderr.flush()
        server = HTTPServer((args.host, args.port), Unhealthy)
        if args.ssl_certfile:  # as the double would: HTTPS only
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        server.serve_forever()
        return 1
    if not DOUBLE.is_file():
        sys.stderr.write(
            f"sglang stand-in: {DOUBLE} is missing (sglang_standin_wheels.py packs it into the wheel)\n"
        )
        return 2
    # SGLang logs its whole ServerArgs at every start (python/sglang/srt/server_args.py, logged by the
    # engine's launch), api_key included: the stand-in does too, so a test sees whether the key reaches
    # the journal.
    sys.stderr.write(
        f"server_args=ServerArgs(model_path={args.model_path!r}, host={args.host!r}, port={args.port}, "
        f"api_key={args.api_key or None!r}, tp_size={args.tp_size}, "
        f"ssl_certfile={args.ssl_certfile or None!r}, ssl_keyfile={args.ssl_keyfile or None!r}, "
        f"ssl_ca_certs={args.ssl_ca_certs or None!r})\n"
    )
    argv_ = double_argv(args)
    sys.stderr.flush()
    # The double's main() on an argument list in memory (not an exec): the key is in no process's
    # command line (/proc/PID/cmdline) and in no environment (/proc/PID/environ).
    spec = importlib.util.spec_from_file_location("sglang._double", DOUBLE)
    assert spec and spec.loader
    double = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = double  # as an import would: dataclasses and pickling look their module up there
    spec.loader.exec_module(double)
    return int(double.main(argv_[2:] + (["--api-key", args.api_key] if args.api_key else [])) or 0)


if __name__ == "__main__":
    sys.exit(main())
