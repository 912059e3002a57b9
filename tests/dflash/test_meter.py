"""The meter: counts summed once, MFU over world x peak, ETA from recent step times; FLOPs by config."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from trainer.dflash.metrics import Meter, MetricsAccumulator, PendingSteps


class _Flops:
    def per_sample(self, s: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return 1e12 * s


def _out(samples: float, tokens: float, supervised: float, keep: list[list[bool]]) -> SimpleNamespace:
    metrics = {"samples": torch.tensor(samples), "tokens": torch.tensor(tokens),
               "supervised_tokens": torch.tensor(supervised)}
    return SimpleNamespace(metrics=metrics, blocks=SimpleNamespace(keep=torch.tensor(keep)))


def test_rates_mfu_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 2.0, 4.0, 4.0])  # start, two step ends, the rates
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    m = Meter(_Flops(), peak_tflops=10.0, world_size=2)
    local = m.count(_out(2.0, 30.0, 20.0, [[True], [True]]), torch.tensor([3, 2]))
    assert local.dtype == torch.float64 and local.tolist() == [2.0, 30.0, 20.0, 5e12]
    dt = m.end_step()
    rec = m.add(local.tolist(), dt)
    assert rec["tokens"] == 30 and rec["step_time_s"] == 2.0
    assert rec["mfu"] == pytest.approx(5e12 / (2.0 * 2 * 10e12))
    m.add(local.tolist(), m.end_step())
    rates = m.rates(steps_left=10)
    assert rates["tokens_per_s"] == 15.0 and rates["samples_per_s"] == 1.0
    assert rates["supervised_tokens_per_s"] == 10.0 and rates["eta_s"] == 20.0
    assert m.state_dict()["tokens"] == 60.0


def test_pending_steps_become_one_line_each_at_the_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 3.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    m = Meter(_Flops(), peak_tflops=None, world_size=1)
    pending = PendingSteps()
    for step, loss in ((1, 2.5), (2, 1.5)):
        acc = MetricsAccumulator()
        acc.add({"tau_sum": torch.tensor(6.0), "blocks": torch.tensor(4.0)})
        counts = m.count(_out(1.0, 10.0 * step, 5.0, [[True, False]]), torch.tensor([10 * step]))
        pending.add(step, torch.tensor(loss), torch.tensor(0.5), acc, counts, lr=1e-3, progress=0.1,
                    total_steps=9, seconds=m.end_step(), eta_s=7.0)
    lines = pending.flush(m, distributed=False)
    assert [s for s, _ in lines] == [1, 2] and not pending.items
    first, second = (r for _, r in lines)
    assert first["loss"] == 2.5 and second["loss"] == 1.5 and first["tau"] == 1.5
    assert first["grad_norm"] == 0.5 and first["lr"] == 1e-3 and first["total_steps"] == 9
    assert first["tokens"] == 10 and second["tokens"] == 20 and second["step_time_s"] == 2.0
    assert list(first)[:4] == ["loss", "tau", "lr", "grad_norm"] and list(first)[-1] == "eta_s"
    assert m.state_dict()["tokens"] == 30.0
    assert pending.flush(m, distributed=False) == []


def test_no_peak_no_mfu() -> None:
    assert Meter(_Flops(), peak_tflops=None, world_size=1).mfu(1e12, 1.0) is None


def test_plan_flops_are_the_meters_count_and_padding_adds_none(make_run, tiny_target_dir) -> None:
    """`trainer plan`'s flops_per_step is what the train loop's meter counts for a batch of full-length
    samples; padded positions and padding blocks add no FLOPs (MFU counts the work asked for)."""
    from trainer.config import load_run_config
    from trainer.dflash import device as dev
    from trainer.dflash.drafter import build_drafter
    from trainer.dflash.plan import build_plan, read_model_config
    from trainer.dflash.step import collate, dflash_forward
    from trainer.dflash.target import load_target

    cfg = load_run_config(make_run(train={"batch_size": 2}))  # data.max_length 64, max_anchors 8
    target = load_target(str(tiny_target_dir), layer_ids=cfg.drafter.target_layer_ids,
                         num_draft_layers=cfg.drafter.num_layers, dtype="float32", device=torch.device("cpu"))
    drafter = build_drafter(cfg.drafter, target, torch.device("cpu"))
    rt = dev.Runtime(torch.device("cpu"), torch.device("cpu"))
    meter = Meter.of(cfg, target.config, drafter.arch, rt)
    g = torch.Generator().manual_seed(0)

    def flops(lengths: list[int], pad_to: int = 0) -> tuple[float, list[int]]:
        rows = [{"input_ids": torch.randint(0, 500, (n,), generator=g).tolist(), "loss_mask": [1] * n}
                for n in lengths]
        batch = collate(rows, pad_to=pad_to)
        with torch.no_grad():
            out = dflash_forward(batch, target, drafter, cfg.drafter, cfg.loss, generator=g)
        return float(meter.count(out, batch.lengths)[3]), out.blocks.keep.sum(1).tolist()

    plan = build_plan(cfg, read_model_config(tiny_target_dir / "config.json"), 80)
    full, kept = flops([64, 64])
    assert kept == [8, 8] and full == pytest.approx(plan.flops_per_step, rel=1e-12)
    padded, _ = flops([40, 20], pad_to=64)
    assert padded == pytest.approx(flops([40, 20])[0], rel=1e-12)
    assert padded == pytest.approx(meter.flops.micro([40, 20], [8, 8]), rel=1e-12)
    few, kept = flops([5], pad_to=64)  # 4 valid anchors: 4 kept blocks, 4 padding blocks
    assert kept == [4] and few == pytest.approx(meter.flops.micro([5], [4]), rel=1e-12)
    assert few < meter.flops.micro([5], [8]) and few < meter.flops.micro([64], [4])
