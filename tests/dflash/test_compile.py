"""Compiled flex attention, on CPU with the aot_eager backend (dynamo and AOT autograd for real, no
inductor): one graph per (padded length, mask kind) whatever the anchors, a loud error past the
recompile budget instead of a silent eager fallback, and inductor on GPU."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.attention.flex_attention as fa
from torch._dynamo.exc import FailOnRecompileLimitHit
from torch._dynamo.utils import counters

from trainer.dflash import device as dev
from trainer.dflash.config import DrafterConfig, LossConfig
from trainer.dflash.drafter import build_drafter
from trainer.dflash.masks import MaskSpec, attend, dense_mask, flex_block_mask
from trainer.dflash.step import collate, dflash_forward
from trainer.dflash.target import TargetModel
from trainer.dflash.tiny import build_tiny_model


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """flex compiled with aot_eager on CPU, fresh dynamo caches and counters; everything restored after."""
    # torch 2.13 refuses flex backward on CPU (flex_attention.py `_validate_device`): its CPU inductor
    # kernel has none. Under aot_eager the flex HOP's math backward runs, and it is correct on CPU
    # (test_compiled_flex_gradients_equal_sdpa).
    monkeypatch.setattr(fa, "_validate_device", lambda q, k, v: None)
    monkeypatch.setattr(dev, "_compile_limit", 0)
    dev.set_compile_backend("aot_eager")
    torch._dynamo.reset()
    counters.clear()
    cfg = torch._dynamo.config
    with cfg.patch(accumulated_recompile_limit=cfg.accumulated_recompile_limit):  # restored after
        yield
    dev.set_compile_backend(None)
    torch._dynamo.reset()


def _rows(pad: int, g: torch.Generator) -> list[dict[str, list[int]]]:
    """Two rows of the bucket whose bound is `pad`: random lengths in (pad - 16, pad], random loss mask."""
    out = []
    for _ in range(2):
        n = int(torch.randint(max(4, pad - 15), pad + 1, (1,), generator=g))
        out.append({"input_ids": torch.randint(0, 500, (n,), generator=g).tolist(),
                    "loss_mask": (torch.rand(n, generator=g) < 0.7).long().tolist()})
    return out


@pytest.mark.slow
def test_training_compiles_once_per_padded_length_and_mask_kind(compiled: None) -> None:
    bounds = (8, 24, 40)  # 3 buckets; max_anchors 12 -> N = 8, 12, 12 blocks
    dev.configure_compile(num_shapes=len(bounds))
    target = TargetModel(build_tiny_model(), (1, 5))
    dcfg = DrafterConfig(num_layers=2, block_size=4, mask_token_id=511, sliding_window=16, max_anchors=12)
    drafter = build_drafter(dcfg, target)
    assert set(drafter.arch.layer_types) == {"sliding_attention", "full_attention"}
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.1)
    before = [p.detach().clone() for p in params]
    g = torch.Generator().manual_seed(0)
    kept: dict[int, set[tuple[int, ...]]] = {b: set() for b in bounds}
    for step in range(20):
        pad = bounds[step % 3]
        out = dflash_forward(collate(_rows(pad, g), pad_to=pad), target, drafter, dcfg, LossConfig(),
                             generator=g, use_flex=True)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        assert out.blocks.num_blocks == min(12, pad) and torch.isfinite(out.loss)
        kept[pad].add(tuple(out.blocks.keep.sum(1).tolist()))
    assert all(len(k) > 1 for k in kept.values()), kept  # the anchor counts did vary within each bucket
    # 2 compiled functions (create_block_mask, flex_attention) x 3 padded lengths x 2 mask kinds, each
    # compiled once with its backward; an eager fallback would show as extra graphs (eager flex compiles
    # its own wrapper per call) or as a graph break
    assert counters["stats"]["unique_graphs"] == 2 * 3 * 2, dict(counters["stats"])
    assert counters["aot_autograd"]["ok"] == 2 * 3 * 2
    assert not counters["graph_break"]
    assert all(not torch.equal(a, b) for a, b in zip(before, params, strict=True))  # trained through flex


def _flex_on(ctx_len: int) -> torch.Tensor:
    anchors = torch.tensor([[1, 3], [2, 0]])
    q, k = torch.randn(2, 2, 8, 16), torch.randn(2, 2, ctx_len + 8, 16)
    return attend(q, k, k, flex_block_mask(MaskSpec(4, ctx_len), anchors), True, 0.25)


def test_exceeding_the_recompile_budget_raises(compiled: None) -> None:
    assert dev.configure_compile(num_shapes=2, mask_kinds=1, margin=0) == 2
    with torch.no_grad():
        _flex_on(8)
        _flex_on(8)  # same shape, new values: no compile
        _flex_on(12)
        with pytest.raises(FailOnRecompileLimitHit):
            _flex_on(16)  # a third length, not an eager run with the full score matrix


def test_compiled_flex_gradients_equal_sdpa(compiled: None) -> None:
    torch.manual_seed(0)
    bs, h, hkv, d, s, b = 2, 4, 2, 16, 24, 4
    anchors = torch.tensor([[3, 10, 17], [5, 0, 0]])  # the second sample ends in padding blocks
    nq = anchors.shape[1] * b
    for spec in (MaskSpec(b, s), MaskSpec(b, s, window=8, block_causal=True)):
        leaves = [torch.randn(bs, n, length, d, requires_grad=True) for n, length in ((h, nq), (hkv, s + nq),
                                                                                     (hkv, s + nq))]
        grads = []
        for flex in (False, True):
            mask = flex_block_mask(spec, anchors) if flex else dense_mask(spec, anchors)
            out = attend(*leaves, mask, flex, d ** -0.5)
            grads.append((out, *torch.autograd.grad((out * out).sum(), leaves)))
        for x, y in zip(*grads, strict=True):
            assert torch.allclose(x, y, atol=1e-5), (spec, (x - y).abs().max())


def test_gpu_compiles_with_inductor_and_cpu_stays_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def fake_compile(fn: Any, **kwargs: Any) -> Any:
        calls.append({"fn": fn.__name__, **kwargs})
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(dev, "_compile_limit", 0)
    dev.set_compile_backend(None)
    acc = torch._dynamo.config.accumulated_recompile_limit
    try:
        assert dev.flex_attention_fn(torch.device("cpu")) is fa.flex_attention
        assert dev.create_block_mask_fn(torch.device("cpu")) is fa.create_block_mask
        assert not calls
        dev.flex_attention_fn(torch.device("cuda", 0))
        dev.create_block_mask_fn(torch.device("cuda", 0))
        dev.flex_attention_fn(torch.device("cuda", 0))  # compiled once, then reused
        limit = dev.DEFAULT_COMPILE_SHAPES * 2 + 8
        common = {"backend": "inductor", "dynamic": False, "fullgraph": True, "recompile_limit": limit,
                  "isolate_recompiles": True}
        assert calls == [{"fn": "flex_attention", **common}, {"fn": "create_block_mask", **common}]
        assert torch._dynamo.config.accumulated_recompile_limit > limit
    finally:
        dev.set_compile_backend(None)
        torch._dynamo.config.accumulated_recompile_limit = acc
