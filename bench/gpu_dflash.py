"""GPU benchmark: one rank of the production run, colocated: the real Qwen3.6-27B target architecture
(random bf16 weights) and the 5-layer SpecForge drafter on the same GPU, the run file's loss (KL + CE on the
target's labels, D-PACE, feature noise), at seq 4096 / 512 anchors / block 16, batch 1.

    python bench/gpu_dflash.py [--out DIR]      # on an H200 / B200 (the target alone is ~55.6 GB in bf16)
    python bench/gpu_dflash.py --tiny           # scaled-down config on CPU: proves the script works

Prints (and writes to DIR/gpu_dflash.json) tokens/s, samples/s, step time, peak memory, MFU (the train
loop's own FLOP count and peak table) and `trainer plan`'s prediction for the same layout. One GPU is one
rank: the drafter state is whole here (a 1-rank FSDP shard is the whole state), so the plan line for the
production layout (8 ranks, state sharded 8 ways) is printed beside it with the difference.

Weights are random (built on the meta device, materialised on the GPU, normal-initialised): no download.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainer.config import RunConfig, load_run_config
from trainer.dflash import device as dev
from trainer.dflash import parallel
from trainer.dflash.drafter import build_drafter
from trainer.dflash.metrics import Meter
from trainer.dflash.optim import build_optimizer
from trainer.dflash.plan import build_plan
from trainer.dflash.step import collate, dflash_forward
from trainer.dflash.target import TargetModel, default_layer_ids
from trainer.dflash.tiny import TINY_TARGET

QWEN36_27B = dict(
    vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
    num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
    linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
    full_attention_interval=4, partial_rotary_factor=0.25, rope_theta=1e7,
)
RUN = Path(__file__).resolve().parents[1] / "files/runs/qwen36-27b-dflash.yml"


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


def run_config(tiny: bool, seq: int, anchors: int, gpu_gb: float) -> RunConfig:
    sets = [f"data.max_length={seq}", f"drafter.max_anchors={anchors}",
            "train.placement.nproc_per_node=1", f"train.placement.gpu_memory_gb={gpu_gb}"]
    if tiny:
        sets += ["drafter.num_layers=2", "drafter.block_size=8", "drafter.mask_token_id=511",
                 "drafter.sliding_window=64", "train.device=cpu", "train.dtype=float32",
                 "target.dtype=float32"]
    return load_run_config(RUN, sets)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="scaled-down model on CPU")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--anchors", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write gpu_dflash.json here")
    args = ap.parse_args()
    seq, anchors = args.seq or (256 if args.tiny else 4096), args.anchors or (32 if args.tiny else 512)
    tkw = {**TINY_TARGET, "vocab_size": 512} if args.tiny else QWEN36_27B
    if args.tiny:
        torch.set_num_threads(2)
    gpu_gb = 141.0
    if torch.cuda.is_available():
        gpu_gb = round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1)
    cfg = run_config(args.tiny, seq, anchors, gpu_gb)
    t = cfg.train
    rt = dev.resolve_runtime(t.device, t.dtype)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    t0 = time.perf_counter()
    model = build_target(tkw, rt.target_device, dtype)
    target = TargetModel(model, default_layer_ids(tkw["num_hidden_layers"], cfg.drafter.num_layers))
    drafter = build_drafter(cfg.drafter, target, rt.device)
    wrapped = parallel.wrap(drafter, rt, t.placement.strategy)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    opt = build_optimizer(params, t)
    meter = Meter.of(cfg, target.config, drafter.arch, rt)
    print(f"built target ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params) + drafter "
          f"({sum(p.numel() for p in params) / 1e9:.3f} B trainable) in {time.perf_counter() - t0:.1f}s "
          f"on {dev.device_name(rt.device)}")
    g = torch.Generator().manual_seed(0)
    vocab = tkw["vocab_size"]
    batch = collate([{"input_ids": torch.randint(0, vocab - 2, (seq,), generator=g).tolist(),
                      "loss_mask": [0] * 64 + [1] * (seq - 64)}], device=rt.device)
    dev.warm_up_target(rt, target, (seq,))
    times, counts = [], None
    for i in range(args.warmup + args.steps):
        dev.synchronize(rt.device)
        if i == args.warmup:
            dev.reset_peak_memory(rt.device)
        start = time.perf_counter()
        with dev.autocast(rt):
            out = dflash_forward(batch, target, wrapped, cfg.drafter, cfg.loss, generator=g,
                                 noise_seed=i, progress=0.1)
            out.loss.backward()
        parallel.clip_grad_norm(params, t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dev.synchronize(rt.device)
        dt = time.perf_counter() - start
        counts = meter.micro(out.metrics, batch.lengths.tolist(), out.blocks.keep.sum(1).tolist())
        warm = " (warm-up)" if i < args.warmup else ""
        print(f"step {i}{warm}: {dt:.3f}s loss {float(out.loss.detach()):.4f}")
        if i >= args.warmup:
            times.append(dt)
    step = statistics.median(times)
    samples, tokens, supervised, flops = counts.tolist()
    mfu = meter.mfu(flops, step)
    peak = dev.peak_memory_gb(rt.device) * 2**30 / 1e9
    tcfg = SimpleNamespace(**{**tkw, "tie_word_embeddings": False, "layer_types": None})
    plan_one = build_plan(cfg, tcfg, gpu_gb)
    prod = load_run_config(RUN, [f"data.max_length={seq}", f"drafter.max_anchors={anchors}"])
    plan_prod = build_plan(dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, placement=prod.train.placement)), tcfg, gpu_gb)
    whole, sharded = plan_one.gpus[0].drafter_state / 1e9, plan_prod.gpus[0].drafter_state / 1e9
    figures = {
        "device": dev.device_name(rt.device), "seq": seq, "anchors": anchors,
        "block": cfg.drafter.block_size, "step_s": round(step, 4), "samples_per_s": round(samples / step, 3),
        "tokens_per_s": round(tokens / step, 1), "supervised_tokens_per_s": round(supervised / step, 1),
        "model_tflop_per_step": round(flops / 1e12, 2), "mfu": mfu, "peak_memory_gb": round(peak, 2),
        "plan_gb_this_layout": round(plan_one.gpus[0].total / 1e9, 2),
        "plan_gb_production_rank": round(plan_prod.gpus[0].total / 1e9, 2),
        "drafter_state_gb_whole": round(whole, 2), "drafter_state_gb_sharded": round(sharded, 2),
        "production_rank_gb_from_measurement": round(peak - whole + sharded, 2),
    }
    f = figures
    print(f"device {f['device']}: seq {seq}, {anchors} anchors x B={f['block']}, batch 1, loss ce "
          f"{cfg.loss.ce_weight} + kl {cfg.loss.kl_weight}, dpace {cfg.loss.dpace}")
    print(f"step {step:.3f}s  {f['tokens_per_s']:,.0f} tokens/s  {f['samples_per_s']:.2f} samples/s  "
          f"MFU {'n/a' if mfu is None else f'{mfu:.1%}'}  peak memory {peak:.1f} GB "
          f"(plan: {f['plan_gb_this_layout']:.1f} GB for this 1-rank layout)")
    print(f"production rank (8 ranks, drafter state sharded {whole:.1f} -> {sharded:.1f} GB): measured "
          f"{f['production_rank_gb_from_measurement']:.1f} GB, plan {f['plan_gb_production_rank']:.1f} GB, "
          f"of {gpu_gb:g}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_dflash.json").write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
