"""HTTPS endpoints: the generator verifies TLS by default and trusts a private CA through SSL_CERT_FILE.

The endpoint is the SGLang double serving HTTPS with a certificate from a throw-away CA (openssl), so the
real client path (aiohttp + the system's verified SSL context) does the handshake.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from genhelpers import Double, check_output, write_prompts, write_run
from test_run import run_stage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
from pve_api_fixture import make_ca

from trainer.generate import endpoints


@pytest.fixture
def https_double(tmp_path: Path) -> Any:
    ca, cert, key = make_ca(tmp_path / "pki")
    d = Double(["--latency", "0.01", "--reasoning-parser", "qwen3", "--tls-cert", str(cert),
                "--tls-key", str(key)], ca=ca)
    endpoints.ssl_context.cache_clear()  # it is built once per process; these tests change its trust
    yield d, ca
    d.stop()
    endpoints.ssl_context.cache_clear()


def test_an_untrusted_certificate_is_refused_and_named(tmp_path: Path, https_double: Any,
                                                       caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = https_double
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    write_prompts(tmp_path / "p.jsonl", 5)
    caplog.set_level(logging.WARNING, logger="trainer.generate")
    started = time.monotonic()
    rc, _ = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url]))  # all_down_timeout_s 1800
    assert rc == 2, "a certificate that does not verify is the run's configuration, not an outage"
    assert time.monotonic() - started < 15
    assert f"{d.url}: TLS certificate verification failed (unable to get local issuer certificate)" \
        in caplog.text
    assert "verified against the system's CA store (generate.ca_file is unset)" in caplog.text
    assert "issued by CN=" in caplog.text
    assert d.stats()["served"] == 0, "nothing may be sent over an unverified connection"


def test_a_private_ca_from_ssl_cert_file_is_trusted(tmp_path: Path, https_double: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    d, ca = https_double
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    expected = write_prompts(tmp_path / "p.jsonl", 30)
    rc, summary = run_stage(write_run(tmp_path, tmp_path / "p.jsonl", [d.url]))
    assert rc == 0 and summary["completed"] == 30
    check_output(tmp_path / "run" / "generated", expected)
