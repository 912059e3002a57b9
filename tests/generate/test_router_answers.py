"""One way answers are stored: through the router and direct to an instance, the same answers give the
same records.

sglang-router 0.3.2, run in front of real SGLang 0.5.23 servers started with --reasoning-parser, answers
its server info without `reasoning_parser`: the generator cannot learn from it whether the instances
split the thinking off. The run file says it then (generate.reasoning_parser). The "router" here is a
loopback proxy to the SGLang double (tests/doubles/sglang_server.py) that answers /server_info and
/get_server_info without that field, as that router did; everything else is forwarded unchanged. The
prompts include the double's empty-thinking case, whose answer holds a stray `</think>`: the one answer
that a client splitting at `</think>` itself stores differently.
"""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from genhelpers import read_output, sglang_double, write_run
from test_run import run_stage
from test_sglang_answers import write_empty_thinking_prompts


class InfoWithoutParser(BaseHTTPRequestHandler):
    """Forwards to `upstream`; the server info comes back without `reasoning_parser`."""

    upstream = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: object) -> None:
        pass

    def _forward(self, body: bytes | None) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
        req = urllib.request.Request(self.upstream + self.path, data=body, headers=headers,
                                     method=self.command)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                code, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            code, data = e.code, e.read()
        if self.path.split("?")[0] in ("/server_info", "/get_server_info") and code == 200:
            info = json.loads(data)
            info.pop("reasoning_parser", None)
            data = json.dumps(info).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))


@pytest.fixture
def router_to(request: pytest.FixtureRequest) -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def make(upstream: str) -> str:
        handler = type("Handler", (InfoWithoutParser,), {"upstream": upstream})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def stored(out: Path) -> dict[str, dict[str, Any]]:
    """id -> the stored record, less what names the path taken (the endpoint)."""
    records = {}
    for r in read_output(out):
        r = dict(r)
        r.pop("endpoint", None)
        for turn in r.get("turns", []):
            turn.pop("endpoint", None)
        records[r["id"]] = r
    return records


@pytest.mark.parametrize("parser", ["qwen3", "none"])
def test_the_router_path_and_the_direct_path_store_the_same_records(tmp_path: Path, sglang: Any,
                                                                    router_to: Any, parser: str) -> None:
    d = sglang("--latency", "0.01", *(["--reasoning-parser", parser] if parser != "none" else []))
    router = router_to(d.url)
    expected = write_empty_thinking_prompts(tmp_path / "p.jsonl", 12)
    rc, _ = run_stage(write_run(tmp_path / "direct", tmp_path / "p.jsonl", [d.url]))
    assert rc == 0
    rc, _ = run_stage(write_run(tmp_path / "router", tmp_path / "p.jsonl", [router], reasoning_parser=parser))
    assert rc == 0
    direct = stored(tmp_path / "direct" / "run" / "generated")
    routed = stored(tmp_path / "router" / "run" / "generated")
    assert set(direct) == set(routed) == set(expected)
    assert routed == direct
    empty = [i for i, turns in expected.items() if sglang_double.EMPTY_THINKING in turns[0]["content"]]
    assert empty and all("</think>" in direct[i]["messages"][-1]["content"] for i in empty), \
        "the case that tells the two ways apart must be among the answers"


def test_without_generate_reasoning_parser_the_router_path_is_told_how_to_store_the_same(
        tmp_path: Path, sglang: Any, router_to: Any, caplog: pytest.LogCaptureFixture) -> None:
    d = sglang("--latency", "0.01", "--reasoning-parser", "qwen3")
    router = router_to(d.url)
    write_empty_thinking_prompts(tmp_path / "p.jsonl", 3)
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [router]))
    assert rc == 0
    said = f"endpoint {router}: its server info does not say whether SGLang runs a reasoning parser"
    assert said in caplog.text
    assert "Set generate.reasoning_parser to the instances' parser (or none)" in caplog.text


def test_a_run_file_that_contradicts_the_server_is_refused(tmp_path: Path, sglang: Any,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    d = sglang("--latency", "0.01", "--reasoning-parser", "qwen3")
    write_empty_thinking_prompts(tmp_path / "p.jsonl", 3)
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], reasoning_parser="none"))
    assert rc == 1
    assert (f"{d.url}: generate.reasoning_parser is 'none' but the server runs 'qwen3' (its server info, "
            "reasoning_parser)") in caplog.text
    assert d.stats()["served"] == 0
