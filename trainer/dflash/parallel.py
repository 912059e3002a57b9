"""How the drafter is spread over the ranks: FSDP2, DDP or one process; and its full, portable state.

- ``fsdp`` (default): torch's FSDP2 ``fully_shard`` on every decoder layer and on the drafter itself.
  The fp32 master weights, their gradients and AdamW's moments are sharded across the ranks (1/world
  each: about 3.5 GB per rank for the Qwen3.6-27B drafter on 8 ranks, against 27.7 GB replicated), so the
  frozen target and its drafter share one GPU. On GPU the parameters are gathered in bf16 and gradients
  reduced in fp32 (``MixedPrecisionPolicy``; also on a bf16 CPU runtime, the GPU checks' CPU mode); they
  stay gathered from forward to backward (``reshard_after_forward=False``: one all-gather per
  micro-batch, ZeRO-2's trade).
- ``ddp``: a full replica and optimizer state per rank, gradients all-reduced.
- ``none``, or a single process: the plain module.

The target's embedding and lm_head are not part of the drafter's module tree (trainer.dflash.drafter), so
no strategy shards or synchronises them. Checkpoints hold full, FQN-keyed states from torch's
``torch.distributed.checkpoint.state_dict`` API, the same for every strategy, so a run resumes under
another strategy or world size.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from trainer.dflash import device as dev


def wrap(drafter: nn.Module, rt: dev.Runtime, strategy: str) -> nn.Module:
    """The drafter as the train loop drives it (sharded, replicated or plain)."""
    if not rt.distributed or strategy == "none":
        return drafter
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [rt.device.index] if rt.device.type == "cuda" else None
        return DDP(drafter, device_ids=ids)
    return shard(drafter, rt)


def shard(drafter: nn.Module, rt: dev.Runtime) -> nn.Module:
    """FSDP2 over the default process group: each decoder layer, then the drafter (fc and norms)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if rt.dtype != torch.float32:  # a bf16 runtime: on GPU, or the GPU checks' CPU mode (gloo)
        mp = MixedPrecisionPolicy(param_dtype=rt.dtype, reduce_dtype=torch.float32)
    for layer in drafter.layers:  # type: ignore[attr-defined]
        fully_shard(layer, mp_policy=mp, reshard_after_forward=False)
    fully_shard(drafter, mp_policy=mp, reshard_after_forward=False)
    return drafter


def core(model: nn.Module) -> nn.Module:
    """The DFlashDrafter inside a wrapper (FSDP2 shards in place: the module itself)."""
    return getattr(model, "module", model)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter for the micro-batches before the last one."""
    if enabled:
        yield
        return
    if hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm (across every shard); returns the norm before clipping, a scalar
    tensor on the gradients' device (read it on a log step: reading it waits for the GPU)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    full = getattr(norm, "full_tensor", None)  # FSDP2 returns a replicated DTensor
    return full() if full is not None else norm


def _options(rt: dev.Runtime, *, broadcast: bool = False) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=rt.distributed,
                            broadcast_from_rank0=broadcast and rt.distributed)


def full_state(model: nn.Module, opt: torch.optim.Optimizer, rt: dev.Runtime
               ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, optimizer state), full and keyed by parameter name, on rank 0 (empty elsewhere).

    A collective: every rank calls it. Weights are the drafter's own (no shared embedding / lm_head).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    opts = _options(rt)
    weights = get_model_state_dict(model, options=opts)
    optim = get_optimizer_state_dict(model, opt, options=opts)
    if not rt.is_main:
        return {}, {}
    return {k: v.detach().cpu() for k, v in weights.items()}, optim


def full_weights(model: nn.Module, rt: dev.Runtime) -> dict[str, torch.Tensor]:
    """The drafter's full weights on rank 0 (empty elsewhere); a collective like `full_state`."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    weights = get_model_state_dict(model, options=_options(rt))
    return {k: v.detach().cpu() for k, v in weights.items()} if rt.is_main else {}


def load_full_state(model: nn.Module, opt: torch.optim.Optimizer, rt: dev.Runtime,
                    weights: dict[str, torch.Tensor], optim: dict[str, Any]) -> None:
    """Load `full_state`'s output (read by rank 0, broadcast to the others, resharded as needed)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    opts = _options(rt, broadcast=True)
    if rt.is_main:
        own = set(core(model).state_dict())
        missing, unexpected = sorted(own - set(weights)), sorted(set(weights) - own)
        if missing or unexpected:
            raise ValueError(f"drafter weights do not match: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
    set_model_state_dict(model, weights, options=opts)
    set_optimizer_state_dict(model, opt, optim, options=opts)
