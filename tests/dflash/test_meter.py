"""The meter: counts summed once, MFU over world x peak, ETA from recent step times; FLOPs by config."""
from __future__ import annotations

import time

import pytest
import torch

from trainer.dflash.metrics import Meter


class _Flops:
    def micro(self, lengths: list[int], blocks: list[int]) -> float:
        return 1e12 * sum(lengths)


def test_rates_mfu_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 2.0, 4.0, 4.0])  # start, two step ends, the rates
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    m = Meter(_Flops(), peak_tflops=10.0, world_size=2)
    metrics = {"samples": torch.tensor(2.0), "tokens": torch.tensor(30.0),
               "supervised_tokens": torch.tensor(20.0)}
    local = m.micro(metrics, [3, 2], [1, 1])
    assert local.tolist() == [2.0, 30.0, 20.0, 5e12]
    rec, stop = m.end_step(local, False, distributed=False)
    assert not stop and rec["tokens"] == 30 and rec["step_time_s"] == 2.0
    assert rec["mfu"] == pytest.approx(5e12 / (2.0 * 2 * 10e12))
    m.end_step(local, True, distributed=False)
    rates = m.rates(steps_left=10)
    assert rates["tokens_per_s"] == 15.0 and rates["samples_per_s"] == 1.0
    assert rates["supervised_tokens_per_s"] == 10.0 and rates["eta_s"] == 20.0
    assert m.state_dict()["tokens"] == 60.0


def test_no_peak_no_mfu() -> None:
    assert Meter(_Flops(), peak_tflops=None, world_size=1).mfu(1e12, 1.0) is None
