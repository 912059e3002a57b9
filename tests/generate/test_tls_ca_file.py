"""generate.ca_file: the generator verifies https:// endpoints against the CA the run names (the SGLang
nodes' private CA, role sglang's sglang_tls_ca_src), and against that CA only.

The endpoint is the SGLang double serving HTTPS with SGLang's own flags (--ssl-certfile/--ssl-keyfile,
sglang/srt/server_args.py) and a certificate from a throw-away CA made here with openssl, so the real client
path (aiohttp with the stage's SSL context) does the handshake.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genhelpers import DOUBLE, Double, check_output, write_prompts, write_run
from test_run import run_stage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
from pve_api_fixture import make_ca

from trainer.config import ConfigError
from trainer.generate import endpoints


@pytest.fixture
def https_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Path, Path]]:
    """(double, its CA, another CA); SSL_CERT_FILE unset, so only generate.ca_file can make it trusted."""
    ca, cert, key = make_ca(tmp_path / "pki")
    other_ca, _, _ = make_ca(tmp_path / "other")
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    d = Double(["--latency", "0.01", "--reasoning-parser", "qwen3", "--ssl-certfile", str(cert),
                "--ssl-keyfile", str(key), "--ssl-ca-certs", str(ca)], ca=ca)
    endpoints.ssl_context.cache_clear()
    yield d, ca, other_ca
    d.stop()
    endpoints.ssl_context.cache_clear()


def test_the_ca_named_by_generate_ca_file_is_trusted(tmp_path: Path, https_double: Any) -> None:
    d, ca, _ = https_double
    assert d.url.startswith("https://")
    expected = write_prompts(tmp_path / "p.jsonl", 20)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], ca_file=str(ca)))
    assert rc == 0 and summary["completed"] == 20
    check_output(tmp_path / "run" / "generated", expected)


def test_a_certificate_from_another_ca_stops_the_run_at_once_naming_ca_and_issuer(
        tmp_path: Path, https_double: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A wrong CA is the run's configuration: exit 2 at the first probe, in seconds (not an outage
    retried for generate.all_down_timeout_s, 1800 s here as by default), naming the endpoint, the CA
    file it was verified against and the issuer of the certificate the server presents."""
    d, ca, other_ca = https_double
    write_prompts(tmp_path / "p.jsonl", 5)
    caplog.set_level(logging.WARNING, logger="trainer.generate")
    started = time.monotonic()
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], ca_file=str(other_ca),
                                all_down_timeout_s=1800.0))
    assert rc == 2
    assert time.monotonic() - started < 15
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    openssl = ["openssl", "x509", "-in", str(ca), "-noout", "-subject", "-nameopt", "RFC2253"]
    issuer = subprocess.run(openssl, capture_output=True, text=True, check=True).stdout.strip()
    issuer = issuer.removeprefix("subject=")
    assert errors[0] == (
        f"generate: {d.url}: TLS certificate verification failed (unable to get local issuer certificate): "
        f"verified against generate.ca_file {other_ca}; the server's certificate was issued by {issuer}. "
        "Set generate.ca_file to the CA certificate (PEM) that signed it")
    assert d.stats()["served"] == 0, "nothing may be sent over an unverified connection"


def test_a_missing_ca_file_stops_the_stage_naming_the_key(tmp_path: Path, https_double: Any) -> None:
    d, _, _ = https_double
    write_prompts(tmp_path / "p.jsonl", 5)
    missing = tmp_path / "nope" / "ca.pem"
    with pytest.raises(ConfigError, match=r"generate\.ca_file: '.*/nope/ca\.pem' is not a file"):
        run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url], ca_file=str(missing)))
    assert d.stats()["served"] == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--ssl-certfile", "CERT"], "--ssl-certfile requires --ssl-keyfile to be specified as well."),
    (["--ssl-keyfile", "KEY"], "--ssl-keyfile requires --ssl-certfile to be specified as well."),
    (["--ssl-ca-certs", "CA"], "--ssl-ca-certs has no effect without --ssl-certfile and --ssl-keyfile."),
    (["--ssl-certfile", "CERT", "--ssl-keyfile", "/nonexistent.key"],
     "SSL key file not found: '/nonexistent.key'. Please check the --ssl-keyfile path."),
])
def test_the_double_refuses_tls_arguments_as_sglang_does(tmp_path: Path, args: list[str],
                                                          message: str) -> None:
    ca, cert, key = make_ca(tmp_path / "pki")
    argv = [{"CERT": str(cert), "KEY": str(key), "CA": str(ca)}.get(a, a) for a in args]
    r = subprocess.run([sys.executable, str(DOUBLE), "--port", "1", *argv], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
