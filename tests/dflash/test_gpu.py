"""GPU checks (`pytest -m gpu`, run by bench/gpu_check.sh on a GPU machine; deselected in CPU CI).

They compare the GPU paths with the CPU-tested fallbacks on a tiny random target: compiled flex attention
against dense SDPA, the fused loss (CE, KL, the target's labels) under bf16 autocast against full logits,
FSDP2's bf16 mixed precision against the plain drafter, and the number of flex compilations over mixed
lengths.

The device comes from one place, GPU_CHECK_DEVICE (cuda, the default, or cpu). `bench/gpu_check.sh --cpu`
(and tests/dflash/test_gpu_cpu_mode.py in CI) runs them on CPU through the same code with the fallbacks
that trainer.dflash.device picks there: flex compiled with aot_eager instead of inductor
(`device.cpu_flex_compile`), gloo instead of NCCL, torch's CPU bf16 autocast. What only a GPU can tell
(the peak TFLOPS table) is skipped on CPU with its reason.
"""
from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

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

_KIND = os.environ.get("GPU_CHECK_DEVICE", "cuda")
if _KIND not in ("cuda", "cpu"):
    raise ValueError(f"GPU_CHECK_DEVICE={_KIND!r}: expected 'cuda' (the default) or 'cpu'")
DEVICE = torch.device("cuda", 0) if _KIND == "cuda" else torch.device("cpu")
ON_CPU = DEVICE.type == "cpu"
DCFG = DrafterConfig(num_layers=2, block_size=8, mask_token_id=511, max_anchors=16, sliding_window=64)
# The compile test's schedule: padded lengths (buckets), sample lengths in (pad - SPREAD, pad], steps. On
# CPU two short buckets and 8 steps: each compiled graph costs seconds of CPU there (aot_eager tracing),
# and alternating two lengths already shows whether a length seen before recompiles.
BUCKETS, SPREAD, STEPS = ((32, 64), 12, 8) if ON_CPU else ((128, 384, 640), 60, 20)


@pytest.fixture(autouse=True)
def _flex_backend() -> Iterator[None]:
    """On CPU, flex attention compiled as the CPU tests compile it (device.cpu_flex_compile); on GPU,
    inductor (the production default)."""
    with dev.cpu_flex_compile() if ON_CPU else contextlib.nullcontext():
        yield


def _setup(seed: int = 0) -> tuple[TargetModel, torch.nn.Module]:
    torch.manual_seed(seed)
    target = TargetModel(build_tiny_model(vocab_size=512).to(DEVICE), default_layer_ids(8, 2))
    return target, build_drafter(DCFG, target, DEVICE)


def _batch(length: int, n: int = 2, seed: int = 0):
    rows = random_rows(n, length, vocab=500, seed=seed, prompt=4)
    return collate([{"input_ids": i, "loss_mask": m} for i, m in rows], device=DEVICE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@pytest.mark.parametrize("label_source,kl_weight", [("data", 0.0), ("target", 1.0)])
def test_fused_loss_under_bf16_autocast_matches_full_logits(label_source: str, kl_weight: float) -> None:
    """token_losses as dflash_forward calls it (the frozen bf16 lm_head module, the verifier = final norm +
    lm_head on the target's rows) against the same quantities from whole [rows, vocab] logits: CE, KL,
    the target's argmax as labels, and d(0.1 CE + kl_weight KL)/dh, the run file's mix."""
    from torch.nn import functional as F

    from trainer.dflash.loss import token_losses

    torch.manual_seed(0)
    rows, hid, vocab = 300, 64, 4096
    head = torch.nn.Linear(hid, vocab, bias=False).to(DEVICE, torch.bfloat16).requires_grad_(False)
    norm = torch.nn.RMSNorm(hid, eps=1e-6).to(DEVICE, torch.bfloat16).requires_grad_(False)

    def verifier(x: torch.Tensor) -> torch.Tensor:
        return head(norm(x))

    h = torch.randn(rows, hid, device=DEVICE, requires_grad=True)
    t_rows = torch.randn(rows, hid, device=DEVICE)
    data_labels = torch.randint(0, vocab, (rows,), device=DEVICE)
    use_target, need_kl = label_source == "target", kl_weight > 0
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        tl = token_losses(h, data_labels, head, chunk_rows=64, verifier=verifier, target_rows=t_rows,
                          use_target_labels=use_target, need_kl=need_kl)
        (0.1 * tl.ce.sum() + kl_weight * tl.kl.sum()).backward()
    g_fused = h.grad.clone()
    h.grad = None
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        logp = F.log_softmax(head(h.to(torch.bfloat16)).float(), dim=-1)
        with torch.no_grad():
            t_logp = F.log_softmax(verifier(t_rows.to(torch.bfloat16)).float(), dim=-1)
        ref_label = t_logp.argmax(-1) if use_target else data_labels
        # CE on the labels the fused path used (a bf16 near-tie may flip an argmax: counted below)
        ce = -logp.gather(1, tl.label[:, None]).squeeze(1)
        kl = (t_logp.exp() * (t_logp - logp)).sum(-1) if need_kl else torch.zeros_like(ce)
        (0.1 * ce.sum() + kl_weight * kl.sum()).backward()
    assert (tl.label == ref_label).float().mean() >= 0.99
    if not use_target:
        assert torch.equal(tl.label, data_labels)
    assert torch.allclose(tl.ce, ce.detach(), rtol=2e-2, atol=2e-2)
    assert torch.allclose(tl.kl, kl.detach(), rtol=2e-2, atol=2e-2)
    assert (tl.pred == logp.argmax(-1)).float().mean() >= 0.99
    if need_kl:
        assert float(tl.kl.detach().mean()) > 0.1  # verifier and draft disagree: a KL that can be wrong
    assert torch.allclose(g_fused, h.grad, rtol=5e-2, atol=5e-3)


def test_fsdp_bf16_mixed_precision_step_matches_plain_drafter(tmp_path) -> None:
    """FSDP2 on a 1-rank process group (NCCL on the GPU, gloo on CPU), bf16 params for compute, fp32
    reduce: the loss of the first step equals the plain drafter's under bf16 autocast, the optimizer
    steps over the DTensor shards and the full state round-trips."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    kwargs = {"device_id": DEVICE} if not ON_CPU else {}
    dist.init_process_group("gloo" if ON_CPU else "nccl", rank=0, world_size=1, **kwargs)
    try:
        target, plain = _setup(3)
        _, sharded = _setup(3)
        rt = dev.Runtime(DEVICE, DEVICE, dtype=torch.bfloat16)
        assert dev.dist_backend(rt) == dist.get_backend()
        sharded = parallel.shard(sharded, rt)
        assert all(isinstance(p, DTensor) for p in sharded.parameters() if p.requires_grad)
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

        params = [p for p in sharded.parameters() if p.requires_grad]
        assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
                   for p in params)  # fp32 master weights, gradients reduced in fp32
        opt = build_optimizer(params, TrainConfig())
        # the training optimizer: fused AdamW over the DTensor shards on GPU (build_optimizer fuses only
        # when every parameter is on CUDA; CPU keeps torch's default implementation)
        assert opt.defaults["fused"] is (None if ON_CPU else True)
        before = {n: p.full_tensor().clone() for n, p in sharded.named_parameters() if p.requires_grad}
        opt.step()
        assert any(not torch.equal(before[n], p.full_tensor()) for n, p in sharded.named_parameters()
                   if p.requires_grad)
        weights, optim = parallel.full_state(sharded, opt, rt)
        assert set(weights) == set(plain.state_dict()) and optim["state"]
        parallel.load_full_state(sharded, opt, rt, weights, optim)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(ON_CPU, reason="the peak TFLOPS table is keyed by GPU name: a CPU has no entry (MFU n/a)")
def test_peak_table_knows_this_gpu() -> None:
    name = dev.device_name(DEVICE)
    assert dev.peak_tflops(DEVICE) is not None, f"add {name!r} to trainer.dflash.device.PEAK_TFLOPS"


def test_inductor_compiles_once_per_padded_length_over_mixed_steps() -> None:
    """STEPS training steps alternating over the padded lengths of BUCKETS (20 over 3 on GPU) with varying
    anchor counts: the compiler (inductor on GPU, aot_eager on CPU) compiles each (length, mask kind) once
    for flex_attention and create_block_mask, and never falls back to eager."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    dev.configure_compile(num_shapes=len(BUCKETS))
    target, drafter = _setup(4)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.1)
    g = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        pad = BUCKETS[step % len(BUCKETS)]
        rows = []
        for _ in range(2):
            n = int(torch.randint(pad - SPREAD, pad + 1, (1,), generator=g))
            rows.append({"input_ids": torch.randint(0, 500, (n,), generator=g).tolist(),
                         "loss_mask": (torch.rand(n, generator=g) < 0.7).long().tolist()})
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            batch = collate(rows, pad_to=pad, device=DEVICE)
            out = dflash_forward(batch, target, drafter, DCFG, LossConfig(), generator=g, use_flex=True)
            out.loss.backward()
        opt.step()
        opt.zero_grad()
        assert torch.isfinite(out.loss)
    assert counters["stats"]["unique_graphs"] == 2 * len(BUCKETS) * 2, dict(counters["stats"])
    assert not counters["graph_break"]
