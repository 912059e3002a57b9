"""Losses and labels: slot k predicts x[a+k] (same position), decay weights, D-PACE against a hand
computation, KL = 0 when the drafter's logits equal the target's, anchors valid only where
loss_mask[a] = loss_mask[a+1] = 1, tau by the cumprod rule."""
from __future__ import annotations

import math

import pytest
import torch

from trainer.dflash.blocks import build_blocks, sample_anchors, valid_anchor_mask
from trainer.dflash.config import LossConfig
from trainer.dflash.loss import combine, decay_gamma, dpace_weights, feature_noise, slot_decay, token_losses
from trainer.dflash.step import acceptance


def test_labels_are_the_same_position_not_shifted() -> None:
    ids = torch.arange(100, 120)[None]  # token at position p is 100 + p
    lm = torch.ones_like(ids)
    keep = torch.ones(1, 2, dtype=torch.bool)
    blocks = build_blocks(ids, lm, torch.tensor([20]), torch.tensor([[3, 9]]), keep,
                          block_size=4, mask_token_id=7)
    assert blocks.block_ids.tolist() == [[103, 7, 7, 7, 109, 7, 7, 7]]
    assert blocks.block_pos.tolist() == [[3, 4, 5, 6, 9, 10, 11, 12]]
    # slot k of the block anchored at a predicts x[a+k]: a shift by one would give 105.. here
    assert blocks.labels.tolist() == [[103, 104, 105, 106, 109, 110, 111, 112]]
    assert blocks.valid.tolist() == [[False, True, True, True, False, True, True, True]]


def test_valid_slots_stop_at_sequence_end_and_loss_mask() -> None:
    ids = torch.arange(10)[None]
    lm = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1, 1, 1]])
    keep = torch.ones(1, 2, dtype=torch.bool)
    blocks = build_blocks(ids, lm, torch.tensor([10]), torch.tensor([[3, 8]]), keep,
                          block_size=4, mask_token_id=0)
    assert blocks.valid.tolist() == [[False, True, False, True, False, True, False, False]]


def test_anchor_validity_and_sampling() -> None:
    lm = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0, 0]])
    lengths = torch.tensor([9, 6])
    assert valid_anchor_mask(lm, lengths).int().tolist() == [[0, 1, 0, 0, 1, 1, 0, 0, 0],
                                                             [1, 1, 1, 1, 1, 0, 0, 0, 0]]
    a, keep = sample_anchors(lm, lengths, max_anchors=4, generator=torch.Generator().manual_seed(0))
    assert a.shape == (2, 4)
    assert keep.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert a[0, :3].tolist() == [1, 4, 5]
    assert a[1].tolist() == sorted(a[1].tolist()) and set(a[1].tolist()) <= {0, 1, 2, 3, 4}


def test_decay_weights() -> None:
    assert decay_gamma(LossConfig(), 16) == 7 and decay_gamma(LossConfig(), 8) == 4
    assert decay_gamma(LossConfig(), 10) == 5
    w = slot_decay(4, 7.0)
    assert w[0] == 0 and w[1] == 1
    assert w[3].item() == pytest.approx(math.exp(-2 / 7))


def test_dpace_weights_by_hand() -> None:
    # CE per slot -> q = exp(-CE) = [1.0, 0.5, 0.2]; alpha = 0.5 -> q~ = [1.0, 0.75, 0.6]
    ce = -torch.log(torch.tensor([[1.0, 0.5, 0.2]]))
    w = dpace_weights(ce, torch.ones(1, 3, dtype=torch.bool), 0.5)
    # P = [1.0, 0.75, 0.45]; w_k = sum_{m>=k} P_m = [2.2, 1.2, 0.45]
    assert w.tolist()[0] == pytest.approx([2.2, 1.2, 0.45], abs=1e-6)


def test_dpace_invalid_slot_is_a_no_op_in_the_prefix_and_left_out_of_the_suffix() -> None:
    # SpecForge's _dpace_weight: q~ = 1 on an invalid slot, prefix * mask in the suffix sum.
    # q = [1, 0.5, (invalid), 0.25], alpha = 0.5 -> q~ = [1, 0.75, 1, 0.625]
    # P = [1, 0.75, 0.75, 0.46875]; P * valid = [1, 0.75, 0, 0.46875]
    # w = suffix sums = [2.21875, 1.21875, 0.46875, 0.46875]
    ce = -torch.log(torch.tensor([[1.0, 0.5, 0.9, 0.25]]))
    valid = torch.tensor([[True, True, False, True]])
    w = dpace_weights(ce, valid, 0.5)
    assert w.tolist()[0] == pytest.approx([2.21875, 1.21875, 0.46875, 0.46875], abs=1e-6)
    # the old rule (invalid: q~ = alpha, summed in) gave [2.359375, 1.359375, 0.609375, 0.234375]
    assert w[0, 3].item() == pytest.approx(0.46875)
    # the invalid slot's CE does not matter
    ce2 = ce.clone()
    ce2[0, 2] = 50.0
    assert torch.equal(dpace_weights(ce2, valid, 0.5), w)


def test_dpace_replaces_the_decay_in_the_loss() -> None:
    # one block of B = 5: slot 0 (anchor, no loss), slots 1..4 with q = [1, 0.5, -, 0.25], slot 3 invalid
    ce = torch.tensor([[[9.0, 0.0, math.log(2), 7.0, math.log(4)]]])
    kl = torch.zeros_like(ce)
    valid = torch.tensor([[[False, True, True, False, True]]])
    w = [2.21875, 1.21875, 0.46875]  # slots 1, 2, 4 (hand-computed above)
    expected = (w[0] * 0.0 + w[1] * math.log(2) + w[2] * math.log(4)) / sum(w)
    for gamma in (0.0, 7.0, -1.0):  # decay_gamma has no effect with dpace (no exp(-(k-1)/gamma) factor)
        loss, parts = combine(ce, kl, valid, LossConfig(dpace=True, dpace_alpha=0.5, decay_gamma=gamma), 5)
        assert loss.item() == pytest.approx(expected, abs=1e-6)
        assert parts["ce"].item() == pytest.approx(expected, abs=1e-6)
    # without dpace the decay applies: weights exp(-(k-1)/7) on slots 1, 2, 4
    d = [1.0, math.exp(-1 / 7), math.exp(-3 / 7)]
    plain = (d[1] * math.log(2) + d[2] * math.log(4)) / sum(d)
    loss, _ = combine(ce, kl, valid, LossConfig(decay_gamma=7.0), 5)
    assert loss.item() == pytest.approx(plain, abs=1e-6)


def test_kl_is_zero_when_draft_logits_equal_target_logits() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 32, bias=False).requires_grad_(False)
    h = torch.randn(10, 8, requires_grad=True)
    labels = torch.randint(0, 32, (10,))
    tl = token_losses(h, labels, head, chunk_rows=4, verifier=head, target_rows=h.detach(), need_kl=True)
    assert tl.kl.abs().max().item() < 1e-6
    other = token_losses(h, labels, head, chunk_rows=4, verifier=lambda x: head(x) * 2,
                         target_rows=h.detach(), need_kl=True)
    assert other.kl.min().item() > 0


def test_chunked_losses_equal_unchunked_and_backprop() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 32, bias=False).requires_grad_(False)
    h = torch.randn(13, 8, requires_grad=True)
    labels = torch.randint(0, 32, (13,))
    ref = torch.nn.functional.cross_entropy(head(h), labels, reduction="none")
    g_ref = torch.autograd.grad(ref.sum(), h)[0]
    tl = token_losses(h, labels, head, chunk_rows=4)
    assert torch.allclose(tl.ce, ref, atol=1e-6)
    assert torch.allclose(torch.autograd.grad(tl.ce.sum(), h)[0], g_ref, atol=1e-6)


def test_no_rows_give_empty_losses() -> None:
    head = torch.nn.Linear(4, 6, bias=False).requires_grad_(False)
    h = torch.zeros(0, 4, requires_grad=True)
    tl = token_losses(h, torch.zeros(0, dtype=torch.long), head, chunk_rows=2, verifier=head,
                      target_rows=torch.zeros(0, 4), need_kl=True)
    assert tl.ce.shape == tl.kl.shape == tl.pred.shape == tl.label.shape == (0,)
    (tl.ce.sum() + tl.kl.sum()).backward()
    assert h.grad is not None and h.grad.shape == (0, 4)


def test_target_labels_come_from_verifier_argmax() -> None:
    head = torch.nn.Linear(4, 6, bias=False).requires_grad_(False)
    h = torch.randn(3, 4)
    tl = token_losses(h, torch.zeros(3, dtype=torch.long), head, chunk_rows=8, verifier=head,
                      target_rows=h, use_target_labels=True)
    assert tl.label.tolist() == head(h).argmax(-1).tolist()
    assert tl.pred.tolist() == tl.label.tolist()


def test_combine_weighted_mean_and_mix() -> None:
    ce = torch.tensor([[[0.0, 1.0, 2.0]]])
    kl = torch.tensor([[[0.0, 3.0, 5.0]]])
    valid = torch.tensor([[[False, True, True]]])
    cfg = LossConfig(ce_weight=0.5, kl_weight=1.0, decay_gamma=-1)  # no decay: plain mean over slots 1..2
    loss, parts = combine(ce, kl, valid, cfg, 3)
    assert parts["ce"].item() == pytest.approx(1.5) and parts["kl"].item() == pytest.approx(4.0)
    assert loss.item() == pytest.approx(0.5 * 1.5 + 4.0)


def test_acceptance_is_cumprod_not_product_of_accuracies() -> None:
    matches = torch.tensor([[[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]]], dtype=torch.bool)
    keep = torch.tensor([[True, True, False]])
    assert acceptance(matches, keep).tolist() == [3, 1]


def test_noise_is_annealed_to_zero() -> None:
    x = torch.zeros(2, 5, 4)
    cfg = LossConfig(noise="gaussian", noise_std=0.5)
    assert feature_noise(x, cfg, 0.0, seed=0).std().item() == pytest.approx(0.5, rel=0.5)
    assert feature_noise(x, cfg, 0.5, seed=0).std().item() == pytest.approx(0.25, rel=0.5)
    assert torch.equal(feature_noise(x, cfg, 1.0, seed=0), x)
    u = feature_noise(x, LossConfig(noise="uniform", noise_std=0.5, noise_anneal=False), 0.7, seed=0)
    assert u.abs().max().item() <= 0.5 * math.sqrt(3) + 1e-6
    assert torch.equal(feature_noise(x, LossConfig(), 0.0, seed=0), x)


def test_noise_is_a_function_of_its_seed() -> None:
    x = torch.zeros(64, 32)
    cfg = LossConfig(noise="gaussian", noise_std=1.0, noise_anneal=False)
    assert torch.equal(feature_noise(x, cfg, 0.0, seed=7), feature_noise(x, cfg, 0.0, seed=7))
    assert not torch.equal(feature_noise(x, cfg, 0.0, seed=7), feature_noise(x, cfg, 0.0, seed=8))
    # no seed: one is drawn from the generator, so equal generators give equal noise
    a = feature_noise(x, cfg, 0.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, feature_noise(x, cfg, 0.0, generator=torch.Generator().manual_seed(1)))
    # no noise to add: the generator is left untouched (anchor sampling after it stays the same)
    g = torch.Generator().manual_seed(1)
    feature_noise(x, LossConfig(), 0.0, generator=g)
    feature_noise(x, LossConfig(noise="gaussian", noise_std=1.0), 1.0, generator=g)
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(1).get_state())
