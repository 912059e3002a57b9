"""Fixtures the role tests share."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from pve_run import PveDouble


@pytest.fixture(scope="module")
def pve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PveDouble]:
    """The Proxmox API double (tests/doubles/pve_api.py), one per test module, started and stopped."""
    double = PveDouble(tmp_path_factory.mktemp("pve"))
    double.start()
    try:
        yield double
    finally:
        double.stop()
