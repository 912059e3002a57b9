"""Block-sparse masks: the predicate by hand, flex == dense (flex attention runs unfused on CPU in
torch 2.13), and no leak: a block's output does not depend on tokens after its anchor."""
from __future__ import annotations

import pytest
import torch

from trainer.dflash import device as dev
from trainer.dflash.blocks import sample_anchors
from trainer.dflash.config import DrafterConfig, LossConfig
from trainer.dflash.drafter import build_drafter
from trainer.dflash.masks import AttentionMasks, MaskSpec, _allowed, attend, dense_mask, flex_block_mask
from trainer.dflash.step import collate, dflash_forward
from trainer.dflash.target import TargetModel
from trainer.dflash.tiny import build_tiny_model


def test_dense_mask_by_hand() -> None:
    # S=6, B=2, anchors [2, 4]: block 0 sees ctx 0,1 + its own block; block 1 sees ctx 0..3
    m = dense_mask(MaskSpec(block_size=2, ctx_len=6), torch.tensor([[2, 4]]))[0, 0].int()
    expect = torch.tensor([
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 1, 1],
    ])
    assert torch.equal(m, expect)


def test_sliding_mask_is_windowed_on_context_and_causal_in_block() -> None:
    m = dense_mask(MaskSpec(block_size=3, ctx_len=8, window=3, block_causal=True), torch.tensor([[6]]))[0, 0]
    # query slot i at position 6+i sees ctx kv with 6+i-kv < 3 and kv < 6, block slots <= i
    assert m[0, :8].nonzero().flatten().tolist() == [4, 5]
    assert m[1, :8].nonzero().flatten().tolist() == [5]
    assert m[2, :8].nonzero().flatten().tolist() == []
    assert m[:, 8:].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_padding_block_sees_only_itself() -> None:
    # S=6, B=2, anchors [3, 0] with the second block padding (keep False, anchor 0): no context at all
    m = dense_mask(MaskSpec(block_size=2, ctx_len=6), torch.tensor([[3, 0]]))[0, 0].int()
    assert m[2:].tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]]
    causal = dense_mask(MaskSpec(2, 6, window=4, block_causal=True), torch.tensor([[3, 0]]))[0, 0].int()
    assert causal[2:].tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]]


def test_flex_equals_dense_attention() -> None:
    assert dev.flex_available()
    torch.manual_seed(0)
    bs, h, hkv, d, s, b = 3, 4, 2, 16, 40, 4
    # the last two samples end in padding blocks (anchor 0, as sample_anchors pads)
    anchors = torch.tensor([[3, 10, 25, 31], [0, 5, 17, 36], [7, 12, 0, 0]])
    nq = anchors.shape[1] * b
    q = torch.randn(bs, h, nq, d)
    k = torch.randn(bs, hkv, s + nq, d)
    v = torch.randn(bs, hkv, s + nq, d)
    for spec in (MaskSpec(b, s), MaskSpec(b, s, window=8, block_causal=True)):
        dense = attend(q, k, v, dense_mask(spec, anchors), False, d ** -0.5)
        flex = attend(q, k, v, flex_block_mask(spec, anchors), True, d ** -0.5)
        assert torch.allclose(dense, flex, atol=1e-5), (spec, (dense - flex).abs().max())


def test_drafter_flex_path_equals_sdpa_path() -> None:
    target = TargetModel(build_tiny_model(), (1, 5))
    dcfg = DrafterConfig(num_layers=2, block_size=4, mask_token_id=511, sliding_window=8, max_anchors=6)
    drafter = build_drafter(dcfg, target)
    batch = collate([{"input_ids": list(range(30)), "loss_mask": [1] * 30}])
    anchors = (torch.tensor([[2, 9, 15, 20, 24, 27]]), torch.ones(1, 6, dtype=torch.bool))
    with torch.no_grad():  # flex has no backward on CPU (torch 2.13); forward numbers are what we compare
        outs = [dflash_forward(batch, target, drafter, dcfg, LossConfig(), anchors=anchors, use_flex=f,
                               train=False) for f in (False, True)]
    assert torch.allclose(outs[0].loss, outs[1].loss, atol=1e-5)


def _batch_with_padding_blocks() -> tuple:
    """A tiny target and drafter, a batch of a 30- and an 11-token row padded to 32, and its anchors."""
    target = TargetModel(build_tiny_model(), (1, 5))
    dcfg = DrafterConfig(num_layers=2, block_size=4, mask_token_id=511, sliding_window=8, max_anchors=12)
    g = torch.Generator().manual_seed(1)
    batch = collate([{"input_ids": torch.randint(0, 500, (n,), generator=g).tolist(),
                      "loss_mask": [0] * 4 + [1] * (n - 4)} for n in (30, 11)], pad_to=32)
    anchors = sample_anchors(batch.loss_mask, batch.lengths, dcfg.max_anchors, g)
    return target, dcfg, build_drafter(dcfg, target), batch, anchors


def test_drafter_flex_equals_sdpa_with_padding_blocks() -> None:
    target, dcfg, drafter, batch, (a, keep) = _batch_with_padding_blocks()
    assert a.shape == (2, 12) and keep.sum(1).tolist() == [12, 6]  # the short row has 6 valid anchors
    with torch.no_grad():
        outs = [dflash_forward(batch, target, drafter, dcfg, LossConfig(), anchors=(a, keep), use_flex=f,
                               train=False) for f in (False, True)]
    assert torch.allclose(outs[0].loss, outs[1].loss, atol=1e-5)
    assert torch.equal(outs[0].matches, outs[1].matches)


def test_padding_blocks_do_not_change_kept_blocks() -> None:
    """Loss, metrics and the kept blocks' outputs are the same whatever the number of padding blocks."""
    target, dcfg, drafter, batch, (a, keep) = _batch_with_padding_blocks()
    a8, k8 = a[:, :8], keep[:, :8]  # 8 blocks: 8 kept + 0 padding, 6 kept + 2 padding
    a20, k20 = torch.zeros(2, 20, dtype=torch.long), torch.zeros(2, 20, dtype=torch.bool)
    a20[:, :8], k20[:, :8] = a8, k8  # the same kept blocks, 12 more padding blocks
    outs = [dflash_forward(batch, target, drafter, dcfg, LossConfig(), anchors=x, use_flex=False, train=False)
            for x in ((a8, k8), (a20, k20))]
    assert torch.allclose(outs[0].loss, outs[1].loss, atol=1e-6)
    for key in ("tau_sum", "blocks", "slot_correct", "slot_count"):
        assert torch.allclose(outs[0].metrics[key], outs[1].metrics[key]), key
    assert torch.equal(outs[0].matches, outs[1].matches[:, :8]) and not outs[1].matches[:, 8:].any()


def test_block_output_does_not_depend_on_tokens_after_its_anchor() -> None:
    """Changing x[a+1:] must not change block(a)'s hidden states: no label leak through the mask."""
    target = TargetModel(build_tiny_model(seed=3), (1, 5))
    dcfg = DrafterConfig(num_layers=2, block_size=4, mask_token_id=511, sliding_window=64)
    drafter = build_drafter(dcfg, target)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 500, (1, 32), generator=g)
    y = x.clone()
    a = 12
    y[0, a + 1:] = torch.randint(0, 500, (31 - a,), generator=g)

    def block_hidden(ids: torch.Tensor) -> torch.Tensor:
        feats = target.features(ids).features
        anchors = torch.tensor([[a]])
        masks = AttentionMasks(anchors, ids.shape[1], 4, 64, True, use_flex=False)
        block_ids = torch.tensor([[int(ids[0, a]), 511, 511, 511]])
        pos = torch.arange(a, a + 4)[None]
        return drafter(block_ids, pos, feats, masks)

    assert torch.allclose(block_hidden(x), block_hidden(y), atol=1e-6)
    z = x.clone()
    z[0, a - 1] = (z[0, a - 1] + 1) % 500  # a context token before the anchor does matter
    assert not torch.allclose(block_hidden(x), block_hidden(z), atol=1e-6)


@pytest.mark.slow
def test_inductor_compiles_the_block_mask_predicate() -> None:
    """On a GPU, create_block_mask runs compiled by inductor; its value-range analysis must be able to bound
    every index expression of the predicate (a clamp on `kv - S` made it fail: "vr must not be None for
    symbol q1"). Inductor's CPU backend runs the same analysis: the compiled mask equals the eager one."""
    from torch.nn.attention.flex_attention import create_block_mask

    spec = MaskSpec(block_size=8, ctx_len=128, window=32, block_causal=True)
    anchors = torch.tensor([[10, 40, 90, 120]])

    def mod(b, h, q, kv):
        return _allowed(spec, anchors, b, q, kv)

    eager = create_block_mask(mod, 1, None, 32, 160, device="cpu", BLOCK_SIZE=16)
    compiled = torch.compile(create_block_mask, backend="inductor")(mod, 1, None, 32, 160, device="cpu",
                                                                     BLOCK_SIZE=16)
    assert torch.equal(eager.to_dense(), compiled.to_dense())
