"""`python -m trainer plan RUN.yml`: GPU memory per card and FLOPs per step, from config.json alone.

No weights are read: the target's sizes come from its ``config.json`` (the VLM layout's ``text_config``
when present), the drafter's from `resolve_arch` exactly as training resolves them. Estimates, per GPU
of ``train.placement`` (one node; every node of a multi-node run is laid out the same):

- target weights: every parameter of the text model in the target dtype (bf16 unless float32);
- target activations: the no-grad forward at ``data.max_length`` (captured layers, the last hidden
  state, one layer's MLP transient);
- drafter state: trainable parameters x 16 bytes (fp32 master weights 4 + grads 4 + AdamW m, v 8), all
  of it per rank with ddp, 1/world of it with fsdp plus the bf16 parameters gathered for compute
  (`drafter_state_bytes`), plus a bf16 copy of the shared embedding and lm_head when the drafter sits
  on another GPU than its target;
- drafter activations: what autograd keeps for ``drafter.max_anchors`` blocks of ``drafter.block_size``
  rows against a ``data.max_length`` context, per layer (residuals in fp32, the rest bf16), flex attention
  (no dense mask);
- logits chunk: ``loss.chunk_blocks`` blocks x vocab: bf16 logits, fp32 log-softmax and its grad, and the
  target's fp32 log-probs / probs when the loss reads soft labels; plus the [rows, hidden] fp32 input
  gradients of CE (and KL) that the fused loss computes in the forward and keeps for backward;
- a fixed 3 GB for the CUDA context, cuBLAS/NCCL workspaces and allocator fragmentation.

It is a budget, not a measurement: bench/gpu_dflash.py measures the real peak on a GPU.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trainer.config import ConfigError, RunConfig

GB = 1e9
OVERHEAD_GB = 3.0


@dataclasses.dataclass
class GpuBudget:
    gpu: int
    ranks: list[int]  # local ranks whose drafter is here
    target_ranks: list[int] = dataclasses.field(default_factory=list)  # ... whose target is here
    target_weights: float = 0.0
    target_activations: float = 0.0
    drafter_state: float = 0.0
    drafter_activations: float = 0.0
    logits_chunk: float = 0.0
    overhead: float = OVERHEAD_GB * GB

    @property
    def total(self) -> float:
        return (self.target_weights + self.target_activations + self.drafter_state + self.drafter_activations
                + self.logits_chunk + self.overhead)


@dataclasses.dataclass
class Plan:
    gpus: list[GpuBudget]
    capacity_gb: float
    target_params: int
    drafter_params: int
    flops_per_step: float  # all ranks of all nodes, one optimizer step
    tokens_per_step: int
    notes: list[str]

    @property
    def too_big(self) -> list[GpuBudget]:
        return [g for g in self.gpus if g.total > self.capacity_gb * GB]


def read_model_config(path: Path) -> SimpleNamespace:
    """config.json -> the text model's config as attributes (VLM checkpoints keep it in text_config)."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the model's config.json ({e.strerror}); "
                          "pass --model-config") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a model config is a JSON object (a transformers config.json), "
                          f"this one is a {type(data).__name__}; pass the target's config.json with "
                          "--model-config")
    text = data.get("text_config") or data
    if not isinstance(text, dict):
        raise ConfigError(f"{path}: text_config is a {type(text).__name__}, not an object; pass the "
                          "target's config.json with --model-config")
    text.setdefault("tie_word_embeddings", data.get("tie_word_embeddings", False))
    return SimpleNamespace(**text)


def _layer_types(t: SimpleNamespace) -> list[str]:
    types = getattr(t, "layer_types", None)
    if types:
        return list(types)
    every = int(getattr(t, "full_attention_interval", 0) or 0)
    if every and hasattr(t, "linear_num_value_heads"):
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                for i in range(t.num_hidden_layers)]
    return ["full_attention"] * int(t.num_hidden_layers)


def target_params(t: SimpleNamespace) -> int:
    """Parameters of the text model: embeddings, lm_head (unless tied), attention / gated-DeltaNet, MLP."""
    h, inter, v = int(t.hidden_size), int(t.intermediate_size), int(t.vocab_size)
    heads, kv = int(t.num_attention_heads), int(getattr(t, "num_key_value_heads", t.num_attention_heads))
    hd = int(getattr(t, "head_dim", 0) or h // heads)
    gate = 2 if getattr(t, "attn_output_gate", False) else 1
    full = h * heads * hd * gate + 2 * h * kv * hd + heads * hd * h + 2 * hd
    lin = 0
    if hasattr(t, "linear_num_value_heads"):
        nk, nv = int(t.linear_num_key_heads), int(t.linear_num_value_heads)
        dk, dv = int(t.linear_key_head_dim), int(t.linear_value_head_dim)
        conv = (2 * nk * dk + nv * dv) * int(getattr(t, "linear_conv_kernel_dim", 4))
        lin = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + conv + nv * dv * h + 2 * nv + dv
    per_layer_common = 3 * h * inter + 2 * h
    total = v * h * (1 if t.tie_word_embeddings else 2) + h
    for kind in _layer_types(t):
        total += per_layer_common + (lin if kind == "linear_attention" else full)
    return total


def drafter_params(a: Any, target_hidden: int) -> int:
    h, d = a.hidden_size, a.head_dim
    hq = a.num_attention_heads * d
    attn = h * hq + 2 * h * a.num_key_value_heads * d + hq * h + 2 * d
    layer = attn + 3 * h * a.intermediate_size + 2 * h
    return len(a.target_layer_ids) * target_hidden * h + h + a.num_layers * layer + h


@dataclasses.dataclass(frozen=True)
class FlopCounter:
    """Model FLOPs of one micro-batch (what MFU counts: no recompute, no padding), from config.json sizes.

    Target: a no-grad forward over the real tokens (2 x non-embedding params per token, plus causal
    attention in its full-attention layers). Drafter: forward + backward (3 x forward) over its query rows
    (kept blocks x block size), K/V and fc over the context. Heads: the drafter's lm_head forward and input
    gradient (4 x H x vocab per row; frozen, no weight gradient), and the verifier's lm_head forward on the
    same rows when the loss reads the target's distribution, on the B - 1 draft slots of each kept block
    (the loss never reads slot 0, the anchor's own token).

    Padding counts for nothing: a sample counts at its real length, and padding blocks (keep = False) and
    padded positions add no FLOPs, so MFU is the work the run asked for, not what the padded shapes cost.
    """

    target_per_token: float
    target_attn_per_token_ctx: float  # x tokens x context length / 2 (causal)
    drafter_per_row: float
    drafter_per_ctx_token: float
    drafter_attn_per_row_ctx: float  # x rows x (context / 2 + block)
    head_per_row: float
    block_size: int

    @classmethod
    def of(cls, cfg: RunConfig, t: Any, arch: Any) -> FlopCounter:
        h_t, v = int(t.hidden_size), int(t.vocab_size)
        full_layers = sum(1 for k in _layer_types(t) if k == "full_attention")
        t_hd = int(getattr(t, "head_dim", 0) or h_t // int(t.num_attention_heads))
        hq, hkv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
        h = arch.hidden_size
        layer = 2 * (h * hq * 2 + 3 * h * arch.intermediate_size)
        head = 4 * h * v + (2 * h_t * v if cfg.loss.needs_target_logits else 0)
        return cls(
            target_per_token=2 * (target_params(t) - v * h_t * 2),
            target_attn_per_token_ctx=full_layers * 2 * 2 * int(t.num_attention_heads) * t_hd,
            drafter_per_row=3 * arch.num_layers * (layer + 2 * 2 * h * hkv),
            drafter_per_ctx_token=3 * (arch.num_layers * 2 * 2 * h * hkv
                                       + 2 * len(arch.target_layer_ids) * h_t * h),
            drafter_attn_per_row_ctx=3 * arch.num_layers * 4 * hq,
            head_per_row=head, block_size=arch.block_size)

    def per_sample(self, s: Any, n: Any) -> Any:
        """FLOPs of a sample of real length `s` with `n` kept blocks: numbers, or tensors elementwise (the
        train loop counts on the device, without reading the lengths back to the host)."""
        rows = n * self.block_size
        return (self.target_per_token * s + self.target_attn_per_token_ctx * s * s / 2
                + self.drafter_per_row * rows + self.drafter_per_ctx_token * s
                + self.drafter_attn_per_row_ctx * rows * (s / 2 + self.block_size)
                + self.head_per_row * n * (self.block_size - 1))

    def micro(self, lengths: list[int], blocks: list[int]) -> float:
        """FLOPs of a micro-batch: each sample's real length and its number of kept blocks."""
        return float(sum(self.per_sample(s, n) for s, n in zip(lengths, blocks, strict=True)))


def drafter_state_bytes(dp: int, largest_unit: int, strategy: str, world: int, bf16: bool) -> float:
    """GPU memory of the drafter's trainable state on one rank.

    fp32 master weights 4 + gradients 4 + AdamW moments 8 = 16 bytes per parameter: all of it on every
    rank with ddp; 1/world of it with fsdp, plus the parameters gathered for compute from forward to
    backward (bf16 on GPU: 2 bytes each) and one unit's unsharded gradient before its reduce-scatter.
    """
    if strategy != "fsdp" or world == 1:
        return dp * 16.0
    gathered = 2 if bf16 else 4
    return dp * 16.0 / world + dp * gathered + largest_unit * (gathered + 4)


def build_plan(cfg: RunConfig, t: SimpleNamespace, capacity_gb: float) -> Plan:
    from trainer.dflash.arch import default_layer_ids, resolve_arch

    d, p, loss = cfg.drafter, cfg.train.placement, cfg.loss
    ids = d.target_layer_ids or default_layer_ids(int(t.num_hidden_layers), d.num_layers)
    a = resolve_arch(d, t, ids, int(t.vocab_size))
    h_t, v, s = int(t.hidden_size), int(t.vocab_size), cfg.data.max_length
    tdtype = cfg.target.dtype if cfg.target.dtype != "auto" else str(getattr(t, "dtype", "bfloat16"))
    tbytes = 4 if tdtype == "float32" else 2
    bs = max(1, cfg.train.max_tokens // s) if cfg.train.max_tokens > 0 else cfg.train.batch_size
    rows = bs * d.max_anchors * d.block_size  # drafter query rows
    n_feat = len(ids)
    tp, dp = target_params(t), drafter_params(a, h_t)

    t_act = bs * s * (n_feat * h_t + h_t + 4 * h_t + 3 * int(t.intermediate_size)) * 2
    hq, hkv = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    per_layer = (rows * a.hidden_size * (4 * 2 + 2 * 2 + 2 * 2)  # fp32 residuals, bf16 norm outs, o_proj out
                 + rows * hq * 2 * 5  # q proj / norm / rope, attention out, its transpose
                 + (s + rows) * (a.hidden_size * 2 + hkv * 2 * 4)  # kv_in, k proj/norm/rope, v
                 + rows * a.intermediate_size * 2 * 4)  # gate, up, silu, product
    ctx = bs * s * (n_feat * h_t * 4 + a.hidden_size * 4 * 3)  # features cast to fp32, fc out, norm
    d_act = a.num_layers * per_layer + ctx + rows * a.hidden_size * 4 * 2  # + final norm in/out
    chunk = min(loss.chunk_blocks * d.block_size, rows)
    logit_b = 2 + 4 + 4 + (12 if loss.needs_target_logits else 0)
    # + what the fused loss keeps for backward: dCE/dh (and dKL/dh) in fp32 for every row the loss reads
    logits = chunk * v * logit_b + rows * a.hidden_size * 4 * (2 if loss.kl_weight > 0 else 1)
    bf16 = cfg.train.dtype == "bfloat16" and cfg.train.device != "cpu"
    fc = n_feat * h_t * a.hidden_size
    unit = max((dp - fc) // a.num_layers, fc)  # the largest FSDP unit: one decoder layer, or the root's fc
    state = drafter_state_bytes(dp, unit, p.strategy, p.world_size, bf16)
    shared_copy = 2 * v * h_t * tbytes

    gpus: dict[int, GpuBudget] = {}

    def gpu(i: int) -> GpuBudget:
        return gpus.setdefault(i, GpuBudget(i, []))

    for r in range(p.nproc_per_node):
        dg = p.drafter_gpus[r] if p.drafter_gpus else r
        tg = p.target_gpus[r % len(p.target_gpus)] if p.target_gpus else dg
        g = gpu(dg)
        g.ranks.append(r)
        g.drafter_state += state + (shared_copy if tg != dg else 0)
        g.drafter_activations += d_act
        g.logits_chunk += logits
        tgt = gpu(tg)
        tgt.target_ranks.append(r)
        tgt.target_weights += tp * tbytes  # each rank loads its own target copy
        tgt.target_activations += t_act
    flops = FlopCounter.of(cfg, t, a)
    micro = flops.micro([s] * bs, [d.max_anchors] * bs)
    world = p.world_size
    notes = [f"drafter state: strategy {p.strategy} over {world} rank(s)"]
    if p.nnodes > 1:
        notes.append(f"every one of the {p.nnodes} nodes is laid out as above")
    return Plan(sorted(gpus.values(), key=lambda g: g.gpu), capacity_gb, tp, dp,
                micro * cfg.train.grad_accum * world, bs * s * cfg.train.grad_accum * world, notes)


def format_plan(cfg: RunConfig, plan: Plan) -> str:
    p = cfg.train.placement
    lines = [
        f"plan for run {cfg.name}: {p.nnodes} node(s) x {p.nproc_per_node} rank(s), "
        f"{plan.capacity_gb:g} GB per GPU (train.placement.gpu_memory_gb or --gpu-memory-gb)",
        f"target {plan.target_params / 1e9:.2f}B params, drafter {plan.drafter_params / 1e9:.3f}B trainable, "
        f"data.max_length {cfg.data.max_length}, drafter.max_anchors {cfg.drafter.max_anchors} x block "
        f"{cfg.drafter.block_size}, loss.chunk_blocks {cfg.loss.chunk_blocks}",
        "",
        f"{'GPU':>3} {'ranks':>6} {'target w':>9} {'tgt act':>8} {'drafter+adam':>12} {'dft act':>8} "
        f"{'logits':>7} {'other':>6} {'total':>7} {'of':>6}  fits",
    ]
    for g in plan.gpus:
        ranks = ",".join([f"d{r}" for r in g.ranks] + [f"t{r}" for r in g.target_ranks])
        lines.append(
            f"{g.gpu:>3} {ranks:>6} {g.target_weights / GB:>9.1f} {g.target_activations / GB:>8.1f} "
            f"{g.drafter_state / GB:>12.1f} {g.drafter_activations / GB:>8.1f} {g.logits_chunk / GB:>7.1f} "
            f"{g.overhead / GB:>6.1f} {g.total / GB:>7.1f} {plan.capacity_gb:>6g}  "
            f"{'yes' if g.total <= plan.capacity_gb * GB else 'NO'}")
    lines += ["(ranks: dN = local rank N's drafter, tN = its target; sizes in GB)", "",
              f"per optimizer step: {plan.tokens_per_step} tokens, {plan.flops_per_step / 1e12:.1f} TFLOP "
              f"({plan.flops_per_step / 1e12 / max(1, p.world_size):.1f} per rank)", *plan.notes]
    return "\n".join(lines)


def plan_json(cfg: RunConfig, plan: Plan) -> dict[str, Any]:
    return {
        "run": cfg.name, "fits": not plan.too_big, "gpu_memory_gb": plan.capacity_gb,
        "target_params": plan.target_params, "drafter_params": plan.drafter_params,
        "flops_per_step": plan.flops_per_step, "tokens_per_step": plan.tokens_per_step,
        "gpus": [{"gpu": g.gpu, "drafter_ranks": g.ranks, "target_ranks": g.target_ranks,
                  "total_gb": round(g.total / GB, 2),
                  **{k: round(getattr(g, k) / GB, 2) for k in ("target_weights", "target_activations",
                                                               "drafter_state", "drafter_activations",
                                                               "logits_chunk", "overhead")}}
                 for g in plan.gpus],
    }


def run_plan(cfg: RunConfig, model_config: Path | None, gpu_memory_gb: float | None, as_json: bool) -> int:
    """`python -m trainer plan`: print the plan; 1 (with the way out, on stderr) when it does not fit."""
    import sys

    if "train" not in cfg.stages:
        needs = (f"run {cfg.name} has no train stage (stages: {', '.join(cfg.stages)}): plan sizes the "
                 "train stage's GPUs only. The generate stage needs its SGLang endpoints "
                 "(generate.endpoints) and no GPU of the trainer; add train to stages to plan it")
        print(json.dumps({"run": cfg.name, "stages": list(cfg.stages), "train": None, "needs": needs},
                         indent=2) if as_json else needs)
        return 0
    path = model_config or Path(cfg.target.path) / "config.json"
    capacity = gpu_memory_gb or cfg.train.placement.gpu_memory_gb
    model = read_model_config(path)
    try:
        plan = build_plan(cfg, model, capacity)
    except AttributeError as e:
        raise ConfigError(f"{path}: the model config has no {getattr(e, 'name', None) or e} (plan reads a "
                          "transformers text config: num_hidden_layers, hidden_size, vocab_size ...); "
                          "pass the target's config.json with --model-config") from None
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise ConfigError(f"{path}: a value of the model config cannot be used ({e}); pass the target's "
                          "config.json with --model-config") from None
    print(json.dumps(plan_json(cfg, plan), indent=2) if as_json else format_plan(cfg, plan))
    if plan.too_big:
        worst = max(plan.too_big, key=lambda g: g.total)
        print(f"error: run {cfg.name} does not fit: GPU {worst.gpu} needs {worst.total / 1e9:.1f} GB "
              f"(target weights {worst.target_weights / 1e9:.1f}, "
              f"drafter + AdamW {worst.drafter_state / 1e9:.1f}, "
              f"activations {(worst.target_activations + worst.drafter_activations) / 1e9:.1f}, logits "
              f"{worst.logits_chunk / 1e9:.1f}) of {capacity:g} GB; {len(plan.too_big)} of {len(plan.gpus)} "
              f"GPUs over. "
              + ("Shard the drafter's state over the ranks (train.placement.strategy: fsdp), spread "
                 if cfg.train.placement.strategy != "fsdp" else "Spread ")
              + "target and drafter (train.placement.target_gpus / drafter_gpus), lower data.max_length, "
              "drafter.max_anchors or loss.chunk_blocks, or use larger cards.",
              file=sys.stderr)
        return 1
    return 0
