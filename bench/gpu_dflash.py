"""GPU benchmark: ranks of the production run, colocated: the real Qwen3.6-27B target architecture (random
bf16 weights) and the 5-layer SpecForge drafter sharded by FSDP2 on the same GPU, the run file's loss (KL +
CE on the target's labels, D-PACE, feature noise), at seq 4096 / 512 anchors / block 16, batch 1 per rank.

    python bench/gpu_dflash.py --out DIR                # one GPU, one rank (H200: the target is ~55.6 GB)
    python bench/gpu_dflash.py --ranks 2 --out DIR      # two ranks, one GPU each (FSDP2 over NCCL)
    python bench/gpu_dflash.py --tiny --ranks 2         # tiny config on CPU (gloo), bf16 autocast: seconds

Every mode runs the train loop's path: FSDP2 `fully_shard` with bf16 parameters and fp32 reduction (also
with one rank: a 1-rank process group, so its all-gathers, reduce-scatters and mixed precision run), the
fused AdamW, the global grad-norm clip. Prints and writes DIR/gpu_dflash-<model>-<device>-<N>rank.json:
the time of the first step (flex compilation, fla autotuning) apart from the median step time, dynamo's
compile time, tokens/s, samples/s, MFU (the loop's own FLOP count and peak table), the peak of memory
*reserved* by the CUDA caching allocator (what the card must hold, fragmentation included) and of memory
allocated, next to `trainer plan`'s prediction for this layout and for the production rank (8 ranks).

The target is constructed on the meta device with bf16 as the default dtype, then materialised once on the
device (`to_empty`): no fp32 copy of its 27B parameters ever exists (108 GB), and no download either
(random normal weights). When `trainer plan` says the whole target and a whole drafter state do not fit
the card (an 80 GB H100 with one rank), the target is cut to fewer layers (a multiple of 4, so each kept
group is 3 DeltaNet + 1 attention layer, as in the real model) and the JSON says so.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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
TINY = {**TINY_TARGET, "vocab_size": 512}
RUN = Path(__file__).resolve().parents[1] / "files/runs/qwen36-27b-dflash.yml"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def construct_target(cfg_kw: dict[str, Any], dtype: torch.dtype) -> torch.nn.Module:
    """Qwen3_5ForCausalLM on the meta device, every parameter created in `dtype` (no storage yet)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    with torch.device("meta"), default_dtype(dtype):
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg_kw))
    wrong = sorted({str(p.dtype) for p in model.parameters() if p.dtype != dtype})
    if wrong:
        raise RuntimeError(f"target constructed with {wrong} parameters, expected {dtype}: materialising "
                           "them would allocate more than the bf16 target")
    return model


def build_target(cfg_kw: dict[str, Any], device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The random target, materialised once on `device` in `dtype` (2 bytes per parameter in bf16)."""
    model = construct_target(cfg_kw, dtype).to_empty(device=device)
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
    # to_empty() leaves buffers uninitialised: rebuild the rotary embedding (fp32 inv_freq) on the device
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=model.config).to(device)
    return model.eval()


def run_config(tiny: bool, seq: int, anchors: int, gpu_gb: float, ranks: int, strategy: str, device: str,
               dtype: str) -> RunConfig:
    sets = [f"data.max_length={seq}", f"drafter.max_anchors={anchors}",
            f"train.placement.nproc_per_node={ranks}", f"train.placement.strategy={strategy}",
            f"train.placement.gpu_memory_gb={gpu_gb}", f"train.device={device}", f"train.dtype={dtype}",
            f"target.dtype={dtype}"]
    if tiny:
        sets += ["drafter.num_layers=2", "drafter.block_size=8", "drafter.mask_token_id=511",
                 "drafter.sliding_window=64"]
    return load_run_config(RUN, sets)


def plan_for(cfg: RunConfig, tkw: dict[str, Any], gpu_gb: float) -> Any:
    t = SimpleNamespace(**{**tkw, "tie_word_embeddings": False, "layer_types": None})
    return build_plan(cfg, t, gpu_gb)


def fit_target_layers(cfg: RunConfig, tkw: dict[str, Any], gpu_gb: float) -> int:
    """The most target layers (a multiple of 4, at least 8) for which the plan fits 95 % of the card."""
    layers = int(tkw["num_hidden_layers"])
    while layers > 8 and plan_for(cfg, {**tkw, "num_hidden_layers": layers}, gpu_gb).gpus[0].total > (
            0.95 * gpu_gb * 1e9):
        layers -= 4
    return layers


def compile_seconds() -> float:
    """Dynamo + backend compile time so far in this process (forward and backward graphs)."""
    from torch._dynamo.utils import calculate_time_spent

    return round(calculate_time_spent().get("total_wall_time", 0.0), 2)


def cuda_memory_gb(device: torch.device) -> tuple[float | None, float | None]:
    """(peak reserved, peak allocated) in GB since the last reset; None off CUDA."""
    if device.type != "cuda":
        return None, None
    return (round(torch.cuda.max_memory_reserved(device) / 1e9, 2),
            round(torch.cuda.max_memory_allocated(device) / 1e9, 2))


def bench(args: argparse.Namespace) -> dict[str, Any] | None:
    """One rank's benchmark (rank 0 returns the figures, the other ranks None)."""
    tiny, ranks = args.tiny, args.ranks
    seq, anchors = args.seq or (128 if tiny else 4096), args.anchors or (16 if tiny else 512)
    tkw = dict(TINY if tiny else QWEN36_27B)
    want_cuda = args.device == "cuda" or (args.device == "auto" and not tiny and torch.cuda.is_available())
    gpu_gb = 141.0
    if want_cuda and torch.cuda.is_available():
        gpu_gb = round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1)
    cfg = run_config(tiny, seq, anchors, gpu_gb, ranks, args.strategy, "cuda" if want_cuda else "cpu",
                     args.dtype)
    t = cfg.train
    rt = dev.resolve_runtime(t.device, t.dtype)
    if args.dtype == "bfloat16" and rt.device.type == "cpu":
        rt = dataclasses.replace(rt, dtype=torch.bfloat16)  # CPU mode: the GPU's bf16 autocast path
    if rt.device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // ranks))
    if args.strategy == "fsdp":  # a process group even for one rank: FSDP2 and its collectives run
        kwargs: dict[str, Any] = {"backend": dev.dist_backend(rt)}
        if rt.device.type == "cuda":
            kwargs["device_id"] = rt.device
        torch.distributed.init_process_group(**kwargs)
    dtype = DTYPES[args.dtype]
    cut = 0
    if not tiny and rt.device.type == "cuda":
        layers = args.target_layers or fit_target_layers(cfg, tkw, gpu_gb)
        if layers != tkw["num_hidden_layers"]:
            cut = tkw["num_hidden_layers"]
            tkw["num_hidden_layers"] = layers
    elif args.target_layers:
        tkw["num_hidden_layers"] = args.target_layers
    log = print if rt.is_main else (lambda *a, **k: None)
    if cut:
        log(f"target cut from {cut} to {tkw['num_hidden_layers']} layers: the plan says the whole target and "
            f"this layout's drafter state do not fit {gpu_gb:g} GB")
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = build_target(tkw, rt.target_device, dtype)
    build_s = time.perf_counter() - t0
    target = TargetModel(model, default_layer_ids(tkw["num_hidden_layers"], cfg.drafter.num_layers))
    drafter = build_drafter(cfg.drafter, target, rt.device)
    wrapped = parallel.shard(drafter, rt) if args.strategy == "fsdp" else drafter
    params = [p for p in wrapped.parameters() if p.requires_grad]
    opt = build_optimizer(params, t)
    meter = Meter.of(cfg, target.config, drafter.arch, rt)
    tparams = sum(p.numel() for p in model.parameters())
    dparams = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    log(f"built target ({tparams / 1e6:,.1f} M params, {sorted({str(p.dtype) for p in model.parameters()})}) "
        f"in {build_s:.1f}s + drafter ({dparams / 1e6:,.1f} M trainable, {args.strategy} over "
        f"{rt.world_size} rank(s), {dev.dist_backend(rt)}) on {dev.device_name(rt.device)}, autocast "
        f"{str(rt.dtype).removeprefix('torch.')}")
    g = torch.Generator().manual_seed(rt.rank)
    vocab = tkw["vocab_size"]
    batch = collate([{"input_ids": torch.randint(0, vocab - 2, (seq,), generator=g).tolist(),
                      "loss_mask": [0] * 64 + [1] * (seq - 64)}], device=rt.device)
    use_flex = {"auto": None, "on": True, "off": False}[args.flex]
    t0 = time.perf_counter()
    dev.warm_up_target(rt, target, (seq,))
    warmup_s = time.perf_counter() - t0
    times, first, counts, losses, first_reserved = [], 0.0, None, [], None
    flex_cpu = dev.cpu_flex_compile() if use_flex and rt.device.type == "cpu" else contextlib.nullcontext()
    with flex_cpu:
        for i in range(args.warmup + args.steps):
            dev.synchronize(rt.device)
            if i == args.warmup:
                first_reserved, _ = cuda_memory_gb(rt.device)  # compilation and autotuning included
                dev.reset_peak_memory(rt.device)
            start = time.perf_counter()
            with dev.autocast(rt):
                out = dflash_forward(batch, target, wrapped, cfg.drafter, cfg.loss, generator=g,
                                     noise_seed=i, progress=0.1, use_flex=use_flex)
                out.loss.backward()
            norm = parallel.clip_grad_norm(params, t.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            dev.synchronize(rt.device)
            dt = time.perf_counter() - start
            counts = meter.count(out, batch.lengths)
            losses.append(float(out.loss.detach()))
            log(f"step {i}{' (warm-up)' if i < args.warmup else ''}: {dt:.3f}s loss {losses[-1]:.4f} "
                f"grad norm {float(norm):.3f}")
            if i == 0:
                first = dt
            if i >= args.warmup:
                times.append(dt)
    if not all(map(lambda x: x == x and abs(x) != float("inf"), losses)):
        raise RuntimeError(f"non-finite loss: {losses}")
    step = statistics.median(times)
    reserved, allocated = cuda_memory_gb(rt.device)
    figures = None
    if rt.is_main:
        figures = report(cfg, tkw, rt, args, gpu_gb, step, first, warmup_s, build_s, counts.tolist(),
                         meter, reserved, allocated, cut, losses)
        figures["peak_reserved_gb_warmup"] = first_reserved
    if torch.distributed.is_initialized():
        dev.destroy_distributed(True)
    return figures


def report(cfg: RunConfig, tkw: dict[str, Any], rt: dev.Runtime, args: argparse.Namespace, gpu_gb: float,
           step: float, first: float, warmup_s: float, build_s: float, counts: list[float], meter: Meter,
           reserved: float | None, allocated: float | None, cut: int, losses: list[float]) -> dict[str, Any]:
    samples, tokens, supervised, flops = counts
    mfu = meter.mfu(flops, step)
    plan_one = plan_for(cfg, tkw, gpu_gb)
    prod = load_run_config(RUN, [f"data.max_length={cfg.data.max_length}",
                                 f"drafter.max_anchors={cfg.drafter.max_anchors}"])
    plan_prod = plan_for(dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, placement=prod.train.placement)), tkw, gpu_gb)
    whole, sharded = plan_one.gpus[0].drafter_state / 1e9, plan_prod.gpus[0].drafter_state / 1e9
    f: dict[str, Any] = {
        "model": "tiny" if args.tiny else "qwen36-27b", "device": dev.device_name(rt.device),
        "ranks": rt.world_size, "strategy": args.strategy, "backend": dev.dist_backend(rt),
        "autocast": str(rt.dtype).removeprefix("torch."), "target_layers": tkw["num_hidden_layers"],
        "target_layers_cut_from": cut or None, "seq": cfg.data.max_length, "anchors": cfg.drafter.max_anchors,
        "block": cfg.drafter.block_size, "target_build_s": round(build_s, 2),
        "target_warmup_s": round(warmup_s, 2), "first_step_s": round(first, 3),
        "compile_s": compile_seconds(), "step_s": round(step, 4), "losses": [round(x, 4) for x in losses],
        "samples_per_s": round(samples / step, 3), "tokens_per_s": round(tokens / step, 1),
        "supervised_tokens_per_s": round(supervised / step, 1),
        "model_tflop_per_step": round(flops / 1e12, 4), "mfu": mfu,
        "peak_reserved_gb": reserved, "peak_allocated_gb": allocated,
        "plan_gb_this_layout": round(plan_one.gpus[0].total / 1e9, 2),
        "plan_gb_production_rank": round(plan_prod.gpus[0].total / 1e9, 2),
        "drafter_state_gb_this_layout": round(whole, 2),
        "drafter_state_gb_production_rank": round(sharded, 2),
        "production_rank_gb_from_measurement": (None if reserved is None
                                                else round(reserved - whole + sharded, 2)),
    }
    print(f"device {f['device']} x {f['ranks']} rank(s), {f['strategy']} over {f['backend']}, autocast "
          f"{f['autocast']}: target {f['target_layers']} layers, seq {f['seq']}, {f['anchors']} anchors x "
          f"B={f['block']}, batch 1, loss ce {cfg.loss.ce_weight} + kl {cfg.loss.kl_weight}, "
          f"dpace {cfg.loss.dpace}")
    print(f"first step {first:.2f}s (dynamo compile {f['compile_s']:.1f}s in all), then step {step:.3f}s: "
          f"{f['tokens_per_s']:,.0f} tokens/s, {f['samples_per_s']:.2f} samples/s per rank, "
          f"MFU {'n/a' if mfu is None else f'{mfu:.1%}'}")
    mem = ("n/a (not CUDA)" if reserved is None
           else f"{reserved:.1f} GB reserved, {allocated:.1f} GB allocated")
    print(f"peak memory {mem}; plan {f['plan_gb_this_layout']:.1f} GB for this layout")
    if reserved is not None:
        print(f"production rank (8 ranks, drafter state {whole:.1f} -> {sharded:.1f} GB): measured "
              f"{f['production_rank_gb_from_measurement']:.1f} GB, plan "
              f"{f['plan_gb_production_rank']:.1f} GB, of {gpu_gb:g}")
    return f


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, args: argparse.Namespace, port: int, out: Path | None) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.ranks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    figures = bench(args)
    if figures is not None and out is not None:
        out.mkdir(parents=True, exist_ok=True)
        kind = "cpu" if figures["device"] == "cpu" else "cuda"
        path = out / f"gpu_dflash-{figures['model']}-{kind}-{figures['ranks']}rank.json"
        path.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny target and drafter (CPU unless --device cuda)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: CUDA when visible (CPU for --tiny)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16",
                    help="target weights and autocast (bf16 runs the GPU's path on CPU too)")
    ap.add_argument("--ranks", type=int, default=1, help="processes, one device each (CPU: gloo)")
    ap.add_argument("--strategy", choices=("fsdp", "none"), default="fsdp")
    ap.add_argument("--flex", choices=("auto", "on", "off"), default="auto",
                    help="auto: flex attention on GPU, SDPA on CPU; on: flex (aot_eager on CPU)")
    ap.add_argument("--target-layers", type=int, default=0, help="0: all (cut to fit the card on GPU)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps (5; 2 with --tiny)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (2; 1 with --tiny)")
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--anchors", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write gpu_dflash-*.json here")
    args = ap.parse_args(argv)
    args.steps = args.steps or (2 if args.tiny else 5)
    args.warmup = args.warmup or (1 if args.tiny else 2)
    if args.ranks < 1 or args.steps < 1 or args.warmup < 1:
        ap.error("--ranks, --steps and --warmup must be >= 1")
    if args.ranks > 1 and args.strategy != "fsdp":
        ap.error("--ranks > 1 needs --strategy fsdp")
    on_cuda = args.device == "cuda" or (args.device == "auto" and not args.tiny and torch.cuda.is_available())
    if on_cuda and args.ranks > torch.cuda.device_count():
        ap.error(f"--ranks {args.ranks} needs {args.ranks} GPUs, {torch.cuda.device_count()} visible")
    port = _free_port()
    if args.ranks == 1:
        _rank_main(0, args, port, args.out)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_rank_main, args=(args, port, args.out), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
