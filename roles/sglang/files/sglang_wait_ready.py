#!/usr/bin/env python3
"""Block until http://HOST:PORT/PATH answers 200 (ExecStartPost of sglang@.service and the router).

The router's unit waits on /readiness: sglang-router answers /health 200 as soon as it runs, with no
worker at all, and /readiness 503 "insufficient healthy workers" until one of its workers answers
(sgl-router/src/server.rs, `readiness`). A refusal's body is in the error, so the journal says why.

    sglang_wait_ready.py HOST PORT [--path /health] [--timeout S] [--cafile CA.pem]

With --cafile the URL is https:// and the server's certificate is verified against that CA, host name
included (the certificate must name HOST); verification is never turned off, so a certificate that does
not verify keeps the unit from becoming active, with the reason in the journal.

With it, systemd reports an instance `active` only once it serves, so the router (ordered after the
instances) and `TimeoutStartSec` mean what they say. Exits 1 with the last error after --timeout.
"""

from __future__ import annotations

import argparse
import ssl
import sys
import time
import urllib.error
import urllib.request


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--path", default="/health")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--cafile", default="", help="speak https, verified against this CA (PEM)")
    a = p.parse_args(argv)
    host = "127.0.0.1" if a.host in ("0.0.0.0", "::") else a.host
    if ":" in host:  # an IPv6 literal goes in brackets in a URL (RFC 3986, section 3.2.2)
        host = f"[{host}]"
    tls = ssl.create_default_context(cafile=a.cafile) if a.cafile else None
    url = f"{'https' if tls else 'http'}://{host}:{a.port}{a.path}"
    deadline, last = time.monotonic() + a.timeout, "no answer yet"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=10, context=tls) as r:
                if r.status == 200:
                    return 0
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code} {e.read()[:300].decode(errors='replace')}".strip()
        except OSError as e:
            last = str(e)
        time.sleep(1.0)
    print(f"{url} not ready after {a.timeout:.0f} s: {last}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
