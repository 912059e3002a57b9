"""GPU checks (`pytest -m gpu`, run by bench/gpu_check.sh on a GPU machine; deselected in CPU CI).

They compare the GPU paths with the CPU-tested fallbacks on a tiny random target: compiled flex attention
(inductor) against dense SDPA, the fused loss under bf16 autocast against full logits, FSDP2's bf16
mixed precision against the plain drafter, and the number of flex compilations over mixed lengths.
"""
from __future__ import annotations

import os

import pytest
import torch
from dflash_factory import random_rows

from trainer.dflash import device as dev
from trainer.dflash import parallel
from trainer.dflash.config import DrafterConfig, LossConfig
from trainer.dflash.drafter import build_drafter
from trainer.dflash.step import collate, dflash_forward
from trainer.dflash.target import TargetModel, default_layer_ids
from trainer.dflash.tiny import build_tiny_model

pytestmark = pytest.mark.gpu  # deselected by pyproject's addopts; bench/gpu_check.sh selects them

CUDA = torch.device("cuda", 0)
DCFG = DrafterConfig(num_layers=2, block_size=8, mask_token_id=511, max_anchors=16, sliding_window=64)


def _setup(seed: int = 0) -> tuple[TargetModel, torch.nn.Module]:
    torch.manual_seed(seed)
    target = TargetModel(build_tiny_model(vocab_size=512).to(CUDA), default_layer_ids(8, 2))
    return target, build_drafter(DCFG, target, CUDA)


def _batch(length: int, n: int = 2, seed: int = 0):
    rows = random_rows(n, length, vocab=500, seed=seed, prompt=4)
    return collate([{"input_ids": i, "loss_mask": m} for i, m in rows], device=CUDA)


def test_compiled_flex_matches_dense_sdpa() -> None:
    target, drafter = _setup()
    batch = _batch(192)
    g = torch.Generator().manual_seed(1)
    from trainer.dflash.blocks import sample_anchors

    anchors = sample_anchors(batch.loss_mask.cpu(), batch.lengths.cpu(), DCFG.max_anchors, g)
    outs = []
    for flex in (True, False):
        out = dflash_forward(batch, target, drafter, DCFG, LossConfig(kl_weight=1.0), anchors=anchors,
                             use_flex=flex, train=False)
        outs.append(out)
    assert torch.allclose(outs[0].loss, outs[1].loss, rtol=1e-4, atol=1e-5)
    assert torch.equal(outs[0].matches, outs[1].matches)


def test_fused_loss_under_bf16_autocast_matches_full_logits() -> None:
    from trainer.dflash.loss import token_losses

    torch.manual_seed(0)
    head = torch.nn.Linear(64, 4096, bias=False).to(CUDA, torch.bfloat16).requires_grad_(False)
    h = torch.randn(300, 64, device=CUDA, requires_grad=True)
    labels = torch.randint(0, 4096, (300,), device=CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        tl = token_losses(h, labels, lambda x: head(x.to(torch.bfloat16)), chunk_rows=64)
        tl.ce.sum().backward()
    g_fused = h.grad.clone()
    h.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = torch.nn.functional.cross_entropy(head(h.to(torch.bfloat16)).float(), labels, reduction="none")
        ref.sum().backward()
    assert torch.allclose(tl.ce, ref.detach(), rtol=2e-2, atol=2e-2)
    assert torch.allclose(g_fused, h.grad, rtol=5e-2, atol=5e-3)


def test_fsdp_bf16_mixed_precision_step_matches_plain_drafter(tmp_path) -> None:
    """FSDP2 on a 1-rank process group (one GPU), bf16 params for compute, fp32 reduce: the loss of the
    first step equals the plain drafter's under bf16 autocast, and the full state round-trips."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=CUDA)
    try:
        target, plain = _setup(3)
        _, sharded = _setup(3)
        rt = dev.Runtime(CUDA, CUDA, dtype=torch.bfloat16)
        sharded = parallel.shard(sharded, rt)
        batch = _batch(128, seed=2)
        losses = []
        for model in (plain, sharded):
            with dev.autocast(rt):
                gen = torch.Generator().manual_seed(5)
                out = dflash_forward(batch, target, model, DCFG, LossConfig(), generator=gen, train=True)
                out.loss.backward()
            losses.append(float(out.loss))
        assert losses[0] == pytest.approx(losses[1], rel=2e-2)
        from trainer.dflash.config import TrainConfig
        from trainer.dflash.optim import build_optimizer

        opt = build_optimizer([p for p in sharded.parameters() if p.requires_grad], TrainConfig())
        assert opt.defaults["fused"]  # the training optimizer: fused AdamW over the DTensor shards
        opt.step()
        weights, optim = parallel.full_state(sharded, opt, rt)
        assert set(weights) == set(plain.state_dict()) and optim["state"]
        parallel.load_full_state(sharded, opt, rt, weights, optim)
    finally:
        dist.destroy_process_group()


def test_peak_table_knows_this_gpu() -> None:
    name = dev.device_name(CUDA)
    assert dev.peak_tflops(CUDA) is not None, f"add {name!r} to trainer.dflash.device.PEAK_TFLOPS"


def test_inductor_compiles_once_per_padded_length_over_mixed_steps() -> None:
    """20 training steps over 3 padded lengths with varying anchor counts: inductor compiles each
    (length, mask kind) once for flex_attention and create_block_mask, and never falls back to eager."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    bounds = (128, 384, 640)
    dev.configure_compile(num_shapes=len(bounds))
    target, drafter = _setup(4)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.1)
    g = torch.Generator().manual_seed(0)
    for step in range(20):
        pad = bounds[step % 3]
        rows = []
        for _ in range(2):
            n = int(torch.randint(pad - 60, pad + 1, (1,), generator=g))
            rows.append({"input_ids": torch.randint(0, 500, (n,), generator=g).tolist(),
                         "loss_mask": (torch.rand(n, generator=g) < 0.7).long().tolist()})
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = dflash_forward(collate(rows, pad_to=pad, device=CUDA), target, drafter, DCFG, LossConfig(),
                                 generator=g, use_flex=True)
            out.loss.backward()
        opt.step()
        opt.zero_grad()
        assert torch.isfinite(out.loss)
    assert counters["stats"]["unique_graphs"] == 2 * 3 * 2, dict(counters["stats"])
    assert not counters["graph_break"]
