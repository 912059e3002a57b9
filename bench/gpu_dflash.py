"""GPU benchmark: the real Qwen3.6-27B target architecture (random bf16 weights) + the 5-layer
SpecForge drafter, N training steps at seq 4096 / 512 anchors / B=16; prints tokens/s, peak memory, MFU.

    python bench/gpu_dflash.py                  # on an H200 (the target alone is ~55.6 GB in bf16)
    python bench/gpu_dflash.py --tiny           # scaled-down config on CPU: proves the script works

Weights are random (built on the meta device, materialised on the GPU, normal-initialised): no download.
MFU counts model FLOPs only: 2 x target params used x S (forward to the last needed layer) +
6 x drafter params x N*B + 6 x H x V x (rows the loss reads) + attention, over the bf16 dense peak.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainer.dflash import device as dev
from trainer.dflash.config import DrafterConfig, LossConfig
from trainer.dflash.drafter import build_drafter
from trainer.dflash.step import collate, dflash_forward
from trainer.dflash.target import TargetModel, default_layer_ids
from trainer.dflash.tiny import TINY_TARGET

QWEN36_27B = dict(
    vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
    num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
    linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
    full_attention_interval=4, partial_rotary_factor=0.25, rope_theta=1e7,
)
DRAFTER_27B = dict(num_layers=5, block_size=16, mask_token_id=248070, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, intermediate_size=17408, sliding_window=2048,
                   max_anchors=512)
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "B200": 2250.0}


def build_target(cfg_kw: dict, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**cfg_kw)
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0, 0.02)
            elif "linear_attn.norm" in name:
                p.fill_(1.0)  # the gated norm of the DeltaNet layers is a plain x * w
            elif name.endswith("A_log"):
                p.uniform_(0, 1)
            else:
                p.zero_()  # zero-centred (1 + w) RMSNorms, dt_bias
    # to_empty() leaves buffers uninitialised: rebuild the rotary embedding's inv_freq on the device
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=cfg).to(device)
    return model.eval()


def model_flops(target: TargetModel, drafter: torch.nn.Module, seq: int, rows: int, n_blocks: int,
                block: int) -> float:
    last = max(target.layer_ids)
    tparams = sum(p.numel() for i, layer in enumerate(target.layers) if i <= last for p in layer.parameters())
    dparams = sum(p.numel() for n, p in drafter.named_parameters() if p.requires_grad)
    a = drafter.arch
    attn = 4 * a.num_attention_heads * a.head_dim * n_blocks * block * (seq + block) * a.num_layers * 3
    kv_ctx = 6 * 2 * a.hidden_size * a.num_key_value_heads * a.head_dim * seq * a.num_layers
    lm = 6 * a.hidden_size * target.vocab_size * rows
    return 2 * tparams * seq + 6 * dparams * n_blocks * block + attn + kv_ctx + lm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="scaled-down model on CPU")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--anchors", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kl", action="store_true", help="soft-label KL (runs the target to the end)")
    args = ap.parse_args()
    rt = dev.resolve_runtime("cpu" if args.tiny else "cuda", "float32" if args.tiny else "bfloat16")
    if args.tiny:
        tkw = {**TINY_TARGET, "vocab_size": 512}
        dkw = dict(num_layers=2, block_size=8, mask_token_id=511, sliding_window=64, max_anchors=32)
        seq, dtype = args.seq or 256, torch.float32
        torch.set_num_threads(2)
    else:
        tkw, dkw, seq, dtype = QWEN36_27B, DRAFTER_27B, args.seq or 4096, torch.bfloat16
    if args.anchors:
        dkw = {**dkw, "max_anchors": args.anchors}
    t0 = time.perf_counter()
    model = build_target(tkw, rt.target_device, dtype)
    target = TargetModel(model, default_layer_ids(tkw["num_hidden_layers"], dkw["num_layers"]))
    dcfg = DrafterConfig(**dkw)
    drafter = build_drafter(dcfg, target, rt.device)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=6e-4,
                            fused=rt.device.type == "cuda" or None)
    lcfg = LossConfig(kl_weight=1.0, ce_weight=0.0) if args.kl else LossConfig()
    print(f"built target ({sum(p.numel() for p in model.parameters()) / 1e6:,.1f} M params) + drafter "
          f"({sum(p.numel() for p in drafter.parameters() if p.requires_grad) / 1e6:,.1f} M trainable) "
          f"in {time.perf_counter() - t0:.1f}s on {rt.device}")
    g = torch.Generator().manual_seed(0)
    vocab = tkw["vocab_size"]
    samples = [{"input_ids": torch.randint(0, vocab - 2, (seq,), generator=g).tolist(),
                "loss_mask": [0] * 64 + [1] * (seq - 64)} for _ in range(args.batch)]
    batch = collate(samples, device=rt.device)
    dev.warm_up_target(rt, target, (seq,))
    times = []
    flops = 0.0
    for i in range(args.warmup + args.steps):
        dev.synchronize(rt.device)
        if i == args.warmup:
            dev.reset_peak_memory(rt.device)
        t = time.perf_counter()
        with dev.autocast(rt):
            out = dflash_forward(batch, target, drafter, dcfg, lcfg, generator=g)
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in drafter.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dev.synchronize(rt.device)
        dt = time.perf_counter() - t
        rows = int(out.metrics["slot_count"].sum())
        n_blocks = out.blocks.num_blocks * args.batch
        flops = model_flops(target, drafter, seq, rows, n_blocks, dcfg.block_size) * args.batch
        tag = " (warm-up)" if i < args.warmup else ""
        print(f"step {i}{tag}: {dt:.3f}s loss {float(out.loss.detach()):.4f}")
        if i >= args.warmup:
            times.append(dt)
    step = sum(times) / len(times)
    tok_s = args.batch * seq / step
    peak = dev.peak_memory_gb(rt.device)
    name = dev.device_name(rt.device)
    peak_tflops = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), 0.0)
    mfu = flops / step / (peak_tflops * 1e12) if peak_tflops else float("nan")
    print(f"device {name}: seq {seq}, {dcfg.max_anchors} anchors x B={dcfg.block_size}, batch {args.batch}, "
          f"{'KL' if args.kl else 'CE'} loss")
    print(f"step {step:.3f}s  tokens/s {tok_s:,.0f}  peak memory {peak:.1f} GiB  "
          f"model TFLOP/step {flops / 1e12:.2f}  MFU {mfu:.1%}")


if __name__ == "__main__":
    main()
