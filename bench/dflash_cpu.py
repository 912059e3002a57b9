"""CPU benchmark: one DFlash training step of this trainer vs a naive reference, same tiny model.

    python bench/dflash_cpu.py [--seq 512] [--anchors 64] [--block 16] [--vocab 4096] [--steps 5]
                               [--chunk-blocks 8] [--threads 2] [--kl]

`--kl` measures twice: CE only, then CE + KL to the target's soft labels (loss.kl_weight 1), where the
trainer sums both logit gradients before its one matmul per chunk and the naive reference takes the
target's full-sequence logits at each row's position.

Trainer: target forward stopped after the last needed layer (no lm_head), blocks at the sampled anchors,
dense SDPA mask, lm_head + loss only on the rows the loss reads, fused and chunked (`loss.chunk_blocks`
blocks of rows at a time, the gradient with respect to the hidden rows computed in the forward).
Naive reference: the full target forward with all hidden states and full-sequence logits, the same
dense mask, the full [N*B, vocab] draft logits in one piece, no chunking, no checkpointing.
Both compute the same loss (checked on the first step) and take AdamW steps.

Each variant runs in its own fresh subprocess (same seeds, so the same weights and batch); the parent
has them take their measured steps in turn (trainer, naive, trainer, ...), so both see the same load
on a shared machine. Time: median wall time of a step (forward, backward, AdamW step), and the median
CPU time of the process over the step (less sensitive to other load). Memory: the peak
resident set of a step above the resident set it starts from, that is what the step allocates on top of
weights, optimizer state and batch: after one warm-up step the child records VmRSS, resets the kernel's
peak counter (``echo 5 > /proc/self/clear_refs``), runs the measured steps and reads VmHWM. glibc's
malloc is told to mmap every block of 128 KiB or more (MALLOC_MMAP_THRESHOLD_), so freed tensors go back
to the kernel and the resident set follows what torch really holds instead of malloc's free lists.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
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

VARIANTS = ("trainer", "naive")


def naive_loss(model: torch.nn.Module, target: TargetModel, drafter: torch.nn.Module, batch: Batch,
               dcfg: DrafterConfig, lcfg: LossConfig, anchors: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """CE (and, with loss.kl_weight, KL(target || draft)) the plain way, as the trainer weights them."""
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
    loss = lcfg.ce_weight * (w * ce).sum() / w.sum()
    if lcfg.kl_weight > 0:
        # the target's prediction of x[a+k] is its logits at position a+k-1
        pos = (blocks.block_pos - 1).clamp(0, out.logits.shape[1] - 1)  # invalid rows: weight 0
        t_logp = F.log_softmax(out.logits.gather(1, pos[..., None].expand(-1, -1, out.logits.shape[-1]))
                               .float(), -1)
        kl = (t_logp.exp() * (t_logp - F.log_softmax(logits.float(), -1))).sum(-1).flatten()
        loss = loss + lcfg.kl_weight * (w * kl).sum() / w.sum()
    return loss, out.logits


def _proc_status(key: str) -> int:
    """A /proc/self/status size (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def run_variant(args: argparse.Namespace) -> None:
    """Child: build everything, warm up one step, then time one step per line read from stdin; on EOF,
    print the peak memory of the measured steps. Replies are JSON lines on stdout."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_tiny_model(vocab_size=args.vocab)
    target = TargetModel(model, default_layer_ids(8, 2))
    dcfg = DrafterConfig(num_layers=2, block_size=args.block, mask_token_id=args.vocab - 1,
                         max_anchors=args.anchors, sliding_window=2048)
    lcfg = LossConfig(chunk_blocks=args.chunk_blocks, kl_weight=args.kl_weight)
    drafter = build_drafter(dcfg, target)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(0, args.vocab - 1, (args.seq,), generator=g).tolist(),
                "loss_mask": [0] * 16 + [1] * (args.seq - 16)} for _ in range(args.batch)]
    batch = collate(samples)
    anchors = sample_anchors(batch.loss_mask, batch.lengths, args.anchors, g)
    if args.variant == "trainer":
        def loss_fn() -> torch.Tensor:
            return dflash_forward(batch, target, drafter, dcfg, lcfg, anchors=anchors, use_flex=False).loss
    else:
        def loss_fn() -> torch.Tensor:
            return naive_loss(model, target, drafter, batch, dcfg, lcfg, anchors)[0]

    def step() -> torch.Tensor:
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def reply(**kw: float) -> None:
        print(json.dumps(kw), flush=True)

    reply(loss=float(step()))  # warm-up; the initial weights' loss, compared across variants
    gc.collect()
    base = _proc_status("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS
    for _ in sys.stdin:
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        reply(seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0)
    peak = _proc_status("VmHWM")
    reply(step_peak=peak - base, base_rss=base, peak_rss=peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk-blocks", type=int, default=8, help="the trainer's loss.chunk_blocks")
    ap.add_argument("--kl", action="store_true", help="also measure CE + KL (loss.kl_weight 1)")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # set in the child processes
    ap.add_argument("--kl-weight", type=float, default=0.0, help=argparse.SUPPRESS)  # the children's loss
    args = ap.parse_args()
    if args.variant:
        run_variant(args)
        return
    for kl_weight in (0.0, 1.0) if args.kl else (0.0,):
        compare(args, kl_weight)


def compare(args: argparse.Namespace, kl_weight: float) -> None:
    """Both variants at one loss (CE only, or CE + kl_weight KL); prints the figures."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    argv = [a for a in sys.argv[1:] if a != "--kl"]
    procs, res = {}, {}
    for v in VARIANTS:  # one after the other: build and warm-up do not overlap
        procs[v] = subprocess.Popen([sys.executable, __file__, *argv, "--variant", v, "--kl-weight",
                                     str(kl_weight)], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        res[v] = {**json.loads(procs[v].stdout.readline()), "times": [], "cpu": []}

    for _ in range(args.steps):
        for v, p in procs.items():
            p.stdin.write("step\n")
            p.stdin.flush()
            r = json.loads(p.stdout.readline())
            res[v]["times"].append(r["seconds"])
            res[v]["cpu"].append(r["cpu_seconds"])
    for v, p in procs.items():
        p.stdin.close()
        res[v].update(json.loads(p.stdout.readline()))
        if p.wait() != 0:
            raise SystemExit(f"{v}: exit status {p.returncode}")
        res[v]["median_s"], res[v]["min_s"] = statistics.median(res[v]["times"]), min(res[v]["times"])
        res[v]["cpu_s"] = statistics.median(res[v]["cpu"])
    a, b = res["trainer"]["loss"], res["naive"]["loss"]
    assert abs(a - b) < 1e-4 * max(1.0, abs(a)), f"losses differ: trainer {a} vs naive {b}"
    rows = args.batch * args.anchors * args.block
    mib = 2**20
    print(f"== loss: {'CE + KL (loss.kl_weight 1)' if kl_weight else 'CE only'}")
    print(f"tiny Qwen3.5 target (8 layers, hidden 64, vocab {args.vocab}), drafter 2 layers; seq {args.seq}, "
          f"{args.anchors} anchors x B={args.block}, batch {args.batch}, {args.threads} threads; "
          f"trainer loss.chunk_blocks {args.chunk_blocks} ({args.chunk_blocks * args.block} rows)")
    print(f"full draft logits the trainer never materialises: {rows} x {args.vocab} fp32 = "
          f"{rows * args.vocab * 4 / mib:.1f} MiB; target logits skipped: "
          f"{args.batch * args.seq * args.vocab * 4 / mib:.1f} MiB")
    print(f"first-step loss: trainer {a:.6f}, naive {b:.6f} (equal)")
    for k, r in res.items():
        print(f"{k:8s} step median {r['median_s'] * 1000:8.1f} ms (min {r['min_s'] * 1000:.1f} ms, "
              f"CPU time {r['cpu_s'] * 1000:.1f} ms)  "
              f"step peak memory {r['step_peak'] / mib:8.1f} MiB (resident {r['base_rss'] / mib:.0f} -> "
              f"{r['peak_rss'] / mib:.0f} MiB)")
    t, n = res["trainer"], res["naive"]
    print(f"speed trainer/naive = {n['median_s'] / t['median_s']:.2f}x (by CPU time "
          f"{n['cpu_s'] / t['cpu_s']:.2f}x); "
          f"memory trainer/naive = {t['step_peak'] / max(1, n['step_peak']):.3f}")


if __name__ == "__main__":
    main()
