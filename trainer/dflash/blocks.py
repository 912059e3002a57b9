"""Anchors and draft blocks: which positions start a block, what the block holds, what each slot predicts.

A position a is a valid anchor when loss_mask[a] = loss_mask[a+1] = 1 (inside the sample's length).
Each step samples min(max_anchors, #valid) anchors per sample without replacement and sorts them, then
pads every sample to N = min(max_anchors, S) blocks (S: the batch's padded length) with ``keep = False``
blocks (anchor 0) that carry no loss. N depends on S alone, not on the data, so the drafter's shapes
are one per padded length and compiled attention does not recompile per anchor count. S bounds N
because a sample of S tokens has at most S - 1 valid anchors: short buckets, which batch many rows,
do not pay for max_anchors blocks each.

Block j is ``[x[a_j], MASK x (B-1)]`` at positions a_j .. a_j+B-1. Slot k (1..B-1) predicts x[a_j + k]:
the token at the *same* position, not shifted. Its base weight is keep * [a+k < len] * loss_mask[a+k].
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Blocks:
    anchors: torch.Tensor  # [bs, N] long (0 where not kept: a padding block)
    keep: torch.Tensor  # [bs, N] bool
    block_ids: torch.Tensor  # [bs, N*B] long: anchor token then MASK
    block_pos: torch.Tensor  # [bs, N*B] long: a + k
    labels: torch.Tensor  # [bs, N*B] long: x[a + k] (0 where out of range)
    valid: torch.Tensor  # [bs, N*B] bool: slot k >= 1 carries loss (keep, in range, loss_mask)
    slot: torch.Tensor  # [N*B] long: k for each row

    @property
    def num_blocks(self) -> int:
        return int(self.anchors.shape[1])

    def to(self, device: torch.device | str) -> Blocks:
        """The blocks on `device`, copied without waiting for the GPU."""
        return Blocks(**{f.name: getattr(self, f.name).to(device, non_blocking=True)
                         for f in dataclasses.fields(self)})


def valid_anchor_mask(loss_mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[bs, S] bool: loss_mask[a] and loss_mask[a+1], with a+1 < length."""
    s = loss_mask.shape[1]
    lm = loss_mask.bool() & (torch.arange(s, device=loss_mask.device)[None] < lengths[:, None])
    out = torch.zeros_like(lm)
    out[:, :-1] = lm[:, :-1] & lm[:, 1:]
    return out


def sample_anchors(loss_mask: torch.Tensor, lengths: torch.Tensor, max_anchors: int,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted anchors [bs, N] and keep [bs, N], N = min(max_anchors, S) for loss_mask [bs, S].

    Each sample keeps min(max_anchors, its #valid) anchors, drawn without replacement; the rest of its
    N slots are padding (anchor 0, keep False).
    """
    valid = valid_anchor_mask(loss_mask, lengths).cpu()
    bs, s = loss_mask.shape
    n = max(1, min(max_anchors, s))
    anchors = torch.zeros(bs, n, dtype=torch.long)
    keep = torch.zeros(bs, n, dtype=torch.bool)
    for b in range(bs):
        cand = valid[b].nonzero().flatten()
        take = min(n, cand.numel())
        if take == 0:
            continue
        pick = cand[torch.randperm(cand.numel(), generator=generator)[:take]].sort().values
        anchors[b, :take] = pick
        keep[b, :take] = True
    return anchors.to(loss_mask.device), keep.to(loss_mask.device)


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor,
                 anchors: torch.Tensor, keep: torch.Tensor, block_size: int, mask_token_id: int) -> Blocks:
    bs, s = input_ids.shape
    n = anchors.shape[1]
    dev = input_ids.device
    k = torch.arange(block_size, device=dev)
    pos = anchors[:, :, None] + k[None, None, :]  # [bs, N, B]
    in_range = pos < lengths[:, None, None]
    safe = pos.clamp(max=s - 1)
    labels = torch.gather(input_ids, 1, safe.reshape(bs, -1)).reshape(bs, n, block_size)
    lm = torch.gather(loss_mask.bool(), 1, safe.reshape(bs, -1)).reshape(bs, n, block_size)
    valid = keep[:, :, None] & in_range & lm & (k > 0)[None, None, :]
    labels = torch.where(in_range, labels, torch.zeros_like(labels))
    block_ids = torch.full((bs, n, block_size), mask_token_id, dtype=torch.long, device=dev)
    block_ids[:, :, 0] = torch.gather(input_ids, 1, anchors)
    return Blocks(
        anchors=anchors, keep=keep, block_ids=block_ids.reshape(bs, -1), block_pos=pos.reshape(bs, -1),
        labels=labels.reshape(bs, -1), valid=valid.reshape(bs, -1), slot=k.repeat(n),
    )
