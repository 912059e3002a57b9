"""Fixtures for the generator tests (helpers live in genhelpers.py)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from genhelpers import Double


@pytest.fixture
def sglang() -> Iterator[Any]:
    """Factory: sglang('--latency', '0.01', ...) -> a running Double; all are killed at teardown."""
    started: list[Double] = []

    def make(*args: str) -> Double:
        d = Double(list(args))
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop()
