"""One DFlash forward: target features -> anchors/blocks -> drafter -> chunked losses -> metrics.

Shared by the train loop, eval and the benchmarks. Acceptance length tau per block is 1 + the number of
leading draft slots that match their label (cumprod of matches), never a product of per-slot accuracies.

No step waits for the GPU: the anchors, the blocks and the rows the loss reads are worked out where the
batch was collated (the host, in training: `collate` on the CPU), then copied over without a sync; the
metrics stay device tensors (the train loop reads them on log steps only).
"""
from __future__ import annotations

import copy
import dataclasses
import weakref
from typing import Any

import torch
from torch import nn

from trainer.dflash.blocks import Blocks, build_blocks, sample_anchors
from trainer.dflash.config import DrafterConfig, LossConfig
from trainer.dflash.loss import combine, feature_noise, token_losses
from trainer.dflash.masks import AttentionMasks


@dataclasses.dataclass
class Batch:
    input_ids: torch.Tensor  # [bs, S] long, right-padded
    loss_mask: torch.Tensor  # [bs, S]
    lengths: torch.Tensor  # [bs]

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def to(self, device: torch.device | str) -> Batch:
        """The batch on `device`, copied without waiting for the GPU (a copy from the host is queued)."""
        return Batch(*(x.to(device, non_blocking=True)
                       for x in (self.input_ids, self.loss_mask, self.lengths)))


def collate(samples: list[dict[str, list[int]]], pad_id: int = 0, device: torch.device | str = "cpu",
            pad_to: int = 0, max_length: int = 0) -> Batch:
    """Right-pad {"input_ids", "loss_mask"} samples into a `Batch` (to `pad_to` when longer than the
    longest sample: few distinct shapes); samples longer than `max_length` (> 0) are cut."""
    if not samples:
        raise ValueError("collate: empty batch")
    if max_length > 0:
        samples = [{"input_ids": x["input_ids"][:max_length], "loss_mask": x["loss_mask"][:max_length]}
                   for x in samples]
    s = max(max(len(x["input_ids"]) for x in samples), min(pad_to, max_length) if max_length else pad_to)
    ids = torch.full((len(samples), s), pad_id, dtype=torch.long)
    mask = torch.zeros(len(samples), s, dtype=torch.long)
    for i, x in enumerate(samples):
        n = len(x["input_ids"])
        if len(x["loss_mask"]) != n:
            raise ValueError(f"sample {i}: input_ids has {n} tokens but loss_mask has {len(x['loss_mask'])}")
        ids[i, :n] = torch.tensor(x["input_ids"], dtype=torch.long)
        mask[i, :n] = torch.tensor(x["loss_mask"], dtype=torch.long)
    lengths = torch.tensor([len(x["input_ids"]) for x in samples], dtype=torch.long)
    return Batch(ids, mask, lengths).to(device)


@dataclasses.dataclass
class StepOutput:
    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]  # detached scalars / vectors
    matches: torch.Tensor  # [bs, N, B-1] bool (valid & draft == label)
    blocks: Blocks
    labels_used: torch.Tensor | None = None  # [bs, N, B] the hard label of each slot (data or target argmax)


def acceptance(matches: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """tau per kept block: 1 + sum(cumprod(matches over slots 1..B-1)). matches [bs, N, B-1] -> [K]."""
    tau = 1 + torch.cumprod(matches.long(), dim=-1).sum(-1)
    return tau[keep]


_NormCopies = weakref.WeakKeyDictionary[nn.Module, dict[torch.device, nn.Module]]
_NORM_COPIES: _NormCopies = weakref.WeakKeyDictionary()


def norm_on(norm: nn.Module, device: torch.device) -> nn.Module:
    """`norm` itself when its weights live on `device`, else a frozen copy there (made once, then reused)."""
    p = next(norm.parameters(), None)
    if p is None or p.device == torch.device(device):
        return norm
    copies = _NORM_COPIES.setdefault(norm, {})
    if device not in copies:
        copies[device] = copy.deepcopy(norm).to(device).requires_grad_(False)
    return copies[device]


def host_blocks(batch: Batch, block_size: int, mask_token_id: int, max_anchors: int,
                generator: torch.Generator | None = None,
                anchors: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[Blocks, torch.Tensor]:
    """The batch's anchors and blocks, and the flat indices of the rows the loss reads, computed where the
    batch lives: on the host for a batch collated on the CPU, so that sizing the rows (a `nonzero`) does
    not wait for the GPU. `anchors` (anchors, keep) replaces the draw from `generator`."""
    ids, lmask, lengths = batch.input_ids, batch.loss_mask, batch.lengths
    a, keep = anchors if anchors is not None else sample_anchors(lmask, lengths, max_anchors, generator)
    blocks = build_blocks(ids, lmask, lengths, a.to(ids.device), keep.to(ids.device), block_size,
                          mask_token_id)
    return blocks, blocks.valid.reshape(-1).nonzero().flatten()


def dflash_forward(batch: Batch, target: Any, drafter: torch.nn.Module, dcfg: DrafterConfig,
                   lcfg: LossConfig, *,
                   generator: torch.Generator | None = None, noise_seed: int | None = None,
                   progress: float = 0.0, anchors: tuple[torch.Tensor, torch.Tensor] | None = None,
                   use_flex: bool | None = None, train: bool = True) -> StepOutput:
    """Loss and metrics of the drafter on one batch (drafter may be DDP-wrapped).

    `generator` draws the anchors (unless `anchors` is given); the feature noise (training only) is
    drawn on the drafter's device from `noise_seed`, or from a seed drawn from `generator` when None.
    The verifier (the target's final norm + lm_head) runs on the drafter's device: only the target's
    last hidden rows the loss reads ([rows, H]) cross over, never logits.
    """
    core = getattr(drafter, "module", drafter)
    arch = core.arch
    dev = core.fc.weight.device
    b_size = arch.block_size
    need_last = lcfg.needs_target_logits
    blocks, rows = host_blocks(batch, b_size, arch.mask_token_id, dcfg.max_anchors, generator, anchors)
    blocks, rows = blocks.to(dev), rows.to(dev, non_blocking=True)
    tout = target.features(batch.input_ids.to(target.embed_tokens.weight.device, non_blocking=True),
                           need_last=need_last)
    feats = tout.features.to(dev)
    on_dev = batch.to(dev)
    ids, lmask, lengths = on_dev.input_ids, on_dev.loss_mask, on_dev.lengths
    if train:
        feats = feature_noise(feats, lcfg, progress, seed=noise_seed, generator=generator)
    masks = AttentionMasks(blocks.anchors, ids.shape[1], b_size, arch.sliding_window,
                           arch.sliding_block_causal, use_flex)
    hidden = drafter(blocks.block_ids, blocks.block_pos, feats, masks)  # [bs, N*B, H]

    bs, nb = blocks.valid.shape
    h_rows = hidden.reshape(bs * nb, -1)[rows]
    labels = blocks.labels.reshape(-1)[rows]
    t_rows, verifier = None, None
    if need_last:
        # the verifier's prediction of x[a+k] lives at position a+k-1
        last = tout.last_hidden
        b_idx = rows // nb
        pos = blocks.block_pos.reshape(-1)[rows] - 1
        t_rows = last[b_idx.to(last.device), pos.to(last.device)].to(dev)
        norm, head = norm_on(target.norm, dev), core.lm_head

        def verifier(x: torch.Tensor) -> torch.Tensor:
            return head(norm(x))

    tl = token_losses(h_rows, labels, core.lm_head, chunk_rows=lcfg.chunk_blocks * b_size,
                      verifier=verifier, target_rows=t_rows, use_target_labels=lcfg.label_source == "target",
                      need_kl=lcfg.kl_weight > 0, ce_grad=lcfg.ce_weight > 0,
                      mix=(lcfg.ce_weight, lcfg.kl_weight))

    def grid(v: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        out = torch.full((bs * nb,), fill, dtype=v.dtype, device=dev)
        out[rows] = v
        return out.reshape(bs, -1, b_size)

    ce, kl = grid(tl.ce), grid(tl.kl)
    valid = blocks.valid.reshape(bs, -1, b_size)
    assert tl.mixed is not None  # asked for with `mix`
    loss, parts = combine(ce, kl, valid, lcfg, b_size, grid(tl.mixed))
    match = grid((tl.pred == tl.label), False)[..., 1:] & valid[..., 1:]
    kept = blocks.keep.float()
    # `acceptance` per block, summed over the kept ones by a product (indexing by `keep` would size its
    # result on the host, waiting for the GPU)
    tau = 1 + torch.cumprod(match.long(), dim=-1).sum(-1)  # [bs, N]
    v = valid[..., 1:].float()
    in_len = torch.arange(ids.shape[1], device=dev)[None] < lengths[:, None]
    metrics = {
        **parts,
        "loss": loss.detach(),
        "slot_correct": match.float().sum((0, 1)),  # [B-1]
        "slot_count": v.sum((0, 1)),
        "tau_sum": (tau.float() * kept).sum(),
        "blocks": kept.sum(),
        "tokens": lengths.sum().float(),
        "samples": torch.full((), float(ids.shape[0]), device=dev),
        "supervised_tokens": (lmask.bool() & in_len).sum().float(),
    }
    return StepOutput(loss, metrics, match, blocks, grid(tl.label))
