"""CPU benchmark: one DFlash training step of this trainer vs a naive reference, same tiny model.

    python bench/dflash_cpu.py [--seq 512] [--anchors 64] [--block 16] [--vocab 4096] [--steps 5]

Trainer: target forward stopped after the last needed layer (no lm_head), blocks at the sampled anchors,
dense SDPA mask, lm_head + loss only on the rows the loss reads, in checkpointed chunks.
Naive reference: the full target forward with all hidden states and full-sequence logits, the same
dense mask, the full [N*B, vocab] draft logits in one piece, no chunking, no checkpointing.
Both compute the same loss (checked) and take one AdamW step. Prints medians and the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.nn import functional as F

from trainer.dflash.blocks import build_blocks, sample_anchors
from trainer.dflash.config import DrafterConfig, LossConfig
from trainer.dflash.drafter import build_drafter
from trainer.dflash.loss import decay_gamma, slot_decay
from trainer.dflash.masks import AttentionMasks
from trainer.dflash.step import Batch, collate, dflash_forward
from trainer.dflash.target import TargetModel, default_layer_ids
from trainer.dflash.tiny import build_tiny_model


def naive_loss(model: torch.nn.Module, target: TargetModel, drafter: torch.nn.Module, batch: Batch,
               dcfg: DrafterConfig, lcfg: LossConfig, anchors: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(batch.input_ids, output_hidden_states=True)  # every layer + full-sequence logits
    feats = torch.cat([out.hidden_states[i + 1] for i in target.layer_ids], -1)
    a, keep = anchors
    blocks = build_blocks(batch.input_ids, batch.loss_mask, batch.lengths, a, keep, dcfg.block_size,
                          dcfg.mask_token_id)
    masks = AttentionMasks(blocks.anchors, batch.input_ids.shape[1], dcfg.block_size, dcfg.sliding_window,
                           True, use_flex=False)
    hidden = drafter(blocks.block_ids, blocks.block_pos, feats, masks)
    logits = drafter.logits(hidden)  # [bs, N*B, V] in one piece
    ce = F.cross_entropy(logits.flatten(0, 1).float(), blocks.labels.flatten(), reduction="none")
    w = blocks.valid.float().reshape(-1, dcfg.block_size)
    w = (w * slot_decay(dcfg.block_size, decay_gamma(lcfg, dcfg.block_size))).flatten()
    return (w * ce).sum() / w.sum(), out.logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_tiny_model(vocab_size=args.vocab)
    target = TargetModel(model, default_layer_ids(8, 2))
    dcfg = DrafterConfig(num_layers=2, block_size=args.block, mask_token_id=args.vocab - 1,
                         max_anchors=args.anchors, sliding_window=2048)
    lcfg = LossConfig()
    drafter = build_drafter(dcfg, target)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(0, args.vocab - 1, (args.seq,), generator=g).tolist(),
                "loss_mask": [0] * 16 + [1] * (args.seq - 16)} for _ in range(args.batch)]
    batch = collate(samples)
    anchors = sample_anchors(batch.loss_mask, batch.lengths, args.anchors, g)

    def ours() -> float:
        return dflash_forward(batch, target, drafter, dcfg, lcfg, anchors=anchors, use_flex=False).loss

    def naive() -> float:
        return naive_loss(model, target, drafter, batch, dcfg, lcfg, anchors)[0]

    a, b = float(ours().detach()), float(naive().detach())
    assert abs(a - b) < 1e-4 * max(1.0, abs(a)), f"losses differ: trainer {a} vs naive {b}"
    times: dict[str, list[float]] = {"trainer": [], "naive": []}
    for _ in range(args.steps):
        for name, fn in (("trainer", ours), ("naive", naive)):
            t0 = time.perf_counter()
            loss = fn()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - t0)
    rows = args.batch * args.anchors * args.block
    print(f"tiny Qwen3.5 target (8 layers, hidden 64, vocab {args.vocab}), drafter 2 layers; seq {args.seq}, "
          f"{args.anchors} anchors x B={args.block}, batch {args.batch}, {args.threads} threads")
    print(f"full draft logits the trainer never materialises: {rows} x {args.vocab} fp32 = "
          f"{rows * args.vocab * 4 / 2**20:.1f} MiB; target logits skipped: "
          f"{args.batch * args.seq * args.vocab * 4 / 2**20:.1f} MiB")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:8s} step median {v * 1000:8.1f} ms  (min {min(times[k]) * 1000:.1f} ms)")
    print(f"ratio naive/trainer = {med['naive'] / med['trainer']:.2f}x")


if __name__ == "__main__":
    main()
