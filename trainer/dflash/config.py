"""Run-config sections `drafter:`, `loss:`, `train:` (owned by trainer/dflash/).

Every size of the drafter defaults to 0 / empty, meaning "derive from the target's config"
(`trainer.dflash.arch.resolve_arch`). The Qwen3.6-27B recipe (SpecForge) is the default
elsewhere: 5 layers, block 16, [sliding x4, full], window 2048, lr 6e-4, warmup 4 %, cosine, clip 1.0,
AdamW betas (0.9, 0.999), weight decay 0.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from trainer.ranges import check_ranges

LayerType = Literal["sliding_attention", "full_attention"]


@dataclasses.dataclass(frozen=True, slots=True)
class DrafterConfig:
    num_layers: int = 5
    block_size: int = 16
    mask_token_id: int = 248070  # SpecForge's MASK for Qwen3.5/3.6; tiny configs set an id < vocab
    target_layer_ids: tuple[int, ...] = ()  # () = round(1 + i*(L-4)/(n-1)), n = num_layers
    hidden_size: int = 0  # 0 = the target's
    intermediate_size: int = 0
    # attention shape, 0 = SpecForge's 32 heads x 128, 8 KV heads for targets with hidden_size >= 2048
    # (its Qwen3.6-27B config), the target's own shape below (trainer.dflash.arch.default_attention_shape)
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    layer_types: tuple[LayerType, ...] = ()  # () = sliding x (n-1) + full
    sliding_window: int = 2048
    rope_theta: float = 0.0  # 0 = the target's
    rms_norm_eps: float = 1e-6
    max_anchors: int = 512  # anchors sampled per sample per step

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"drafter.num_layers must be >= 1, got {self.num_layers}")
        if self.block_size < 2:
            raise ValueError(f"drafter.block_size must be >= 2, got {self.block_size}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"drafter.layer_types has {len(self.layer_types)} entries, "
                f"drafter.num_layers is {self.num_layers}"
            )
        if self.max_anchors < 1:
            raise ValueError(f"drafter.max_anchors must be >= 1, got {self.max_anchors}")
        check_ranges(self, "drafter", {
            "mask_token_id": ">= 0", "target_layer_ids": ">= 0", "hidden_size": ">= 0",
            "intermediate_size": ">= 0", "num_attention_heads": ">= 0", "num_key_value_heads": ">= 0",
            "head_dim": ">= 0", "sliding_window": ">= 1", "rope_theta": ">= 0", "rms_norm_eps": "> 0"})


@dataclasses.dataclass(frozen=True, slots=True)
class LossConfig:
    ce_weight: float = 1.0  # hard-label CE (paper default)
    kl_weight: float = 0.0  # soft-label KL to the target's distribution at a+k-1
    # exp(-(k-1)/gamma); 0 = by block size (16->7, 10->5, 8->4, else B/2.3); < 0 = no decay.
    # Unused with dpace: D-PACE's weights replace the decay (SpecForge, see trainer/dflash/loss.py).
    decay_gamma: float = 0.0
    dpace: bool = False  # D-PACE streak-aware weights instead of the decay
    dpace_alpha: float = 0.5
    noise: Literal["none", "gaussian", "uniform"] = "none"  # on the context features
    noise_std: float = 0.05  # initial std, cosine-annealed to 0 over the run
    noise_anneal: bool = True
    chunk_blocks: int = 64  # blocks per fused lm_head + loss chunk (its input gradient made in the forward)
    label_source: Literal["data", "target"] = "data"  # hard labels: data tokens or the target's argmax

    def __post_init__(self) -> None:
        if self.ce_weight < 0 or self.kl_weight < 0 or self.ce_weight + self.kl_weight <= 0:
            raise ValueError("loss.ce_weight and loss.kl_weight must be >= 0 and not both 0")
        if not 0.0 <= self.dpace_alpha <= 1.0:
            raise ValueError(f"loss.dpace_alpha must be in [0, 1], got {self.dpace_alpha}")
        if self.chunk_blocks < 1:
            raise ValueError(f"loss.chunk_blocks must be >= 1, got {self.chunk_blocks}")
        check_ranges(self, "loss", {"noise_std": ">= 0"})

    @property
    def needs_target_logits(self) -> bool:
        return self.kl_weight > 0 or self.label_source == "target"


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Which devices hold the frozen target and the drafter replicas, and how ranks are spread.

    With torchrun, each rank trains one drafter replica on ``drafter_gpus[local_rank]`` and runs its
    own target copy on ``target_gpus[local_rank % len(target_gpus)]`` ([] = the drafter's GPU).
    Multi-node: torchrun's static rendezvous on ``rdzv_endpoint`` (node 0 hosts it; ranks follow
    ``node_rank``); ``nnodes`` x ``nproc_per_node``.
    """

    target_gpus: tuple[int, ...] = ()
    drafter_gpus: tuple[int, ...] = ()  # () = local_rank
    nnodes: int = 1
    nproc_per_node: int = 1  # > 1 (or nnodes > 1): the train stage starts torchrun itself, one rank per GPU
    node_rank: int = 0  # this node's rank (multi-node: --set train.placement.node_rank=N per node)
    rdzv_endpoint: str = "localhost:29500"  # host:port of the rendezvous (node 0's address multi-node)
    rdzv_id: str = ""  # "" = the run name
    # how long a collective may wait for the slowest rank before the process group fails the job (minutes);
    # torch's NCCL default is 10, which the first steps' compiles or rank 0's checkpoint write can exceed
    timeout_min: float = 60.0
    # memory of one GPU, for `python -m trainer plan` (and its refusal); 80 = an H100/A100 80 GB, the
    # smallest card the 27B recipe is run on. Set 96 (96 GB cards), 141 (H200) or 180 (B200).
    gpu_memory_gb: float = 80.0
    # dense bf16 peak of one GPU in TFLOPS, for the MFU the log reports; 0 = from the table of known
    # GPUs by device name (trainer.dflash.device.PEAK_TFLOPS), none on an unknown GPU or the CPU
    gpu_peak_tflops: float = 0.0
    # fsdp: the drafter's fp32 weights, gradients and AdamW state sharded across the ranks (torch FSDP2
    # `fully_shard`, bf16 compute on GPU), so a target and its drafter share one GPU;
    # ddp: a full drafter replica and its AdamW state on every rank; none: one process, no wrapper.
    # Checkpoints hold full (unsharded) states: any strategy and world size resumes from any other.
    strategy: Literal["fsdp", "ddp", "none"] = "fsdp"

    def __post_init__(self) -> None:
        if self.nnodes < 1 or self.nproc_per_node < 1:
            raise ValueError("train.placement.nnodes and nproc_per_node must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"train.placement.node_rank={self.node_rank} is not in 0..{self.nnodes - 1}")
        if self.drafter_gpus and len(self.drafter_gpus) != self.nproc_per_node:
            raise ValueError(f"train.placement.drafter_gpus has {len(self.drafter_gpus)} entries, "
                             f"nproc_per_node is {self.nproc_per_node} (one drafter GPU per local rank)")
        if self.timeout_min <= 0:
            raise ValueError(f"train.placement.timeout_min must be > 0, got {self.timeout_min}")
        if self.gpu_memory_gb <= 0:
            raise ValueError(f"train.placement.gpu_memory_gb must be > 0, got {self.gpu_memory_gb}")
        if self.gpu_peak_tflops < 0:
            raise ValueError(f"train.placement.gpu_peak_tflops must be >= 0, got {self.gpu_peak_tflops}")
        check_ranges(self, "train.placement", {"target_gpus": ">= 0", "drafter_gpus": ">= 0"})

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def launches_torchrun(self) -> bool:
        """Whether the train stage runs its ranks under torchrun (more than one process in all)."""
        return self.world_size > 1


@dataclasses.dataclass(frozen=True, slots=True)
class TrainConfig:
    lr: float = 6e-4
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of lr
    weight_decay: float = 0.0
    # AdamW betas: SpecForge's recipe, followed. Its BF16Optimizer (specforge/optimizer.py L42, a6b6b02;
    # built by specforge/training/assembly.py L261-266 for every run, examples/configs/qwen3.6-27b-dflash-
    # online.yaml included) calls torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay): torch's
    # default betas (0.9, 0.999). (0.9, 0.95) was a pretraining habit with no DFlash result behind it.
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_ratio: float = 0.04
    epochs: int = 6
    max_steps: int = 0  # 0 = epochs x batches; >0 caps the optimizer steps
    batch_size: int = 1  # samples per micro-batch per rank
    max_tokens: int = 0  # >0: token-budget batches instead of batch_size
    grad_accum: int = 1
    grad_clip: float = 1.0
    dtype: Literal["bfloat16", "float32"] = "bfloat16"  # autocast dtype on GPU; CPU always float32
    device: Literal["auto", "cpu", "cuda"] = "auto"
    placement: PlacementConfig = dataclasses.field(default_factory=PlacementConfig)
    log_every: int = 10
    save_every: int = 500  # optimizer steps; 0 = only at the end
    keep_last: int = 3
    upload_checkpoints: bool = False  # copy each checkpoint to s3://<s3.bucket>/<s3.prefix>/checkpoints/
    allow_unchecked_data: bool = False  # train on shards the doctor did not pass (dangerous)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"train.lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"train.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        check_ranges(self, "train", {
            "min_lr_ratio": "[0, 1]", "weight_decay": ">= 0", "betas": "[0, 1)", "epochs": ">= 1",
            "max_steps": ">= 0", "batch_size": ">= 1", "max_tokens": ">= 0", "grad_accum": ">= 1",
            "grad_clip": ">= 0", "log_every": ">= 1", "save_every": ">= 0", "keep_last": ">= 1"})
