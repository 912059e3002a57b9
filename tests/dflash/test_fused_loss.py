"""The fused lm_head + loss (gradients computed in the forward, each matmul run once) against the previous
implementation, kept below as the reference: losses and gradients equal to 1e-6 (float32, CPU).

The reference is the earlier `token_losses` (lm_head + log-softmax + the verifier's norm + lm_head per
chunk inside `torch.utils.checkpoint`, recomputed in backward) and the loss path of the earlier
`dflash_forward`, copied as they were.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from trainer.dflash.blocks import build_blocks, sample_anchors
from trainer.dflash.config import DrafterConfig, LossConfig
from trainer.dflash.drafter import build_drafter
from trainer.dflash.loss import TokenLosses, combine, feature_noise, token_losses
from trainer.dflash.masks import AttentionMasks
from trainer.dflash.step import Batch, acceptance, collate, dflash_forward, norm_on
from trainer.dflash.target import TargetModel
from trainer.dflash.tiny import build_tiny_model

# ---- the previous implementation (reference) ------------------------------------------------------------

Head = Callable[[torch.Tensor], torch.Tensor]


def _ref_feature_noise(features: torch.Tensor, cfg: LossConfig, progress: float,
                       generator: torch.Generator | None) -> torch.Tensor:
    if cfg.noise == "none" or cfg.noise_std <= 0:
        return features
    frac = min(max(progress, 0.0), 1.0)
    std = cfg.noise_std * (0.5 * (1 + math.cos(math.pi * frac)) if cfg.noise_anneal else 1.0)
    if std == 0:
        return features
    shape, dev = features.shape, features.device
    if cfg.noise == "gaussian":
        n = torch.randn(shape, generator=generator, dtype=torch.float32).to(dev) * std
    else:  # uniform with the same std
        n = (torch.rand(shape, generator=generator, dtype=torch.float32).to(dev) * 2 - 1) * std * math.sqrt(3)
    return features + n.to(features.dtype)


def _chunk_fn(head: Head, verifier: Head | None, use_target_labels: bool,
              need_kl: bool) -> Callable[..., tuple]:
    def fn(h: torch.Tensor, labels: torch.Tensor, t_rows: torch.Tensor | None):
        logp = F.log_softmax(head(h).float(), dim=-1)
        kl = torch.zeros(h.shape[0], device=h.device)
        if t_rows is not None and verifier is not None:
            with torch.no_grad():
                t_logp = F.log_softmax(verifier(t_rows).float().to(h.device), dim=-1)
            if use_target_labels:
                labels = t_logp.argmax(-1)
            if need_kl:
                kl = (t_logp.exp() * (t_logp - logp)).sum(-1)
        ce = -logp.gather(1, labels[:, None]).squeeze(1)
        return ce, kl, logp.detach().argmax(-1), labels

    return fn


def ref_token_losses(hidden: torch.Tensor, labels: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                     *, chunk_rows: int, verifier: Callable[[torch.Tensor], torch.Tensor] | None = None,
                     target_rows: torch.Tensor | None = None, use_target_labels: bool = False,
                     need_kl: bool = False, use_checkpoint: bool = True) -> TokenLosses:
    fn = _chunk_fn(head, verifier, use_target_labels, need_kl)
    outs = []
    for s in range(0, hidden.shape[0], chunk_rows):
        h = hidden[s:s + chunk_rows]
        lab = labels[s:s + chunk_rows]
        t = target_rows[s:s + chunk_rows] if target_rows is not None else None
        if use_checkpoint and torch.is_grad_enabled() and h.requires_grad:
            outs.append(checkpoint(fn, h, lab, t, use_reentrant=False))
        else:
            outs.append(fn(h, lab, t))
    if not outs:
        z = hidden.new_zeros(0)
        return TokenLosses(z, z, labels[:0], labels[:0])
    return TokenLosses(*(torch.cat([o[i] for o in outs]) for i in range(4)))


@dataclasses.dataclass
class RefOutput:
    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]
    matches: torch.Tensor
    labels_used: torch.Tensor


def ref_dflash_forward(batch: Batch, target: Any, drafter: torch.nn.Module, dcfg: DrafterConfig,
                       lcfg: LossConfig, *, generator: torch.Generator | None = None, progress: float = 0.0,
                       anchors: tuple[torch.Tensor, torch.Tensor] | None = None, use_flex: bool | None = None,
                       train: bool = True) -> RefOutput:
    core = getattr(drafter, "module", drafter)
    arch = core.arch
    dev = core.fc.weight.device
    b_size = arch.block_size
    need_last = lcfg.needs_target_logits
    tout = target.features(batch.input_ids.to(target.embed_tokens.weight.device), need_last=need_last)
    feats = tout.features.to(dev)
    ids, lmask, lengths = batch.input_ids.to(dev), batch.loss_mask.to(dev), batch.lengths.to(dev)
    if train:
        feats = _ref_feature_noise(feats, lcfg, progress, generator)
    a, keep = anchors if anchors is not None else sample_anchors(lmask, lengths, dcfg.max_anchors, generator)
    blocks = build_blocks(ids, lmask, lengths, a.to(dev), keep.to(dev), b_size, arch.mask_token_id)
    masks = AttentionMasks(blocks.anchors, ids.shape[1], b_size, arch.sliding_window,
                           arch.sliding_block_causal, use_flex)
    hidden = drafter(blocks.block_ids, blocks.block_pos, feats, masks)  # [bs, N*B, H]

    bs, nb = blocks.valid.shape
    rows = blocks.valid.reshape(-1).nonzero().flatten()  # only the rows the loss reads
    h_rows = hidden.reshape(bs * nb, -1)[rows]
    labels = blocks.labels.reshape(-1)[rows]
    t_rows = None
    if need_last:
        # the verifier's prediction of x[a+k] lives at position a+k-1
        b_idx = rows // nb
        pos = blocks.block_pos.reshape(-1)[rows] - 1
        t_rows = tout.last_hidden[b_idx.to(tout.last_hidden.device), pos.to(tout.last_hidden.device)]
    tl = ref_token_losses(h_rows, labels, core.logits, chunk_rows=lcfg.chunk_blocks * b_size,
                          verifier=target.logits_at if need_last else None, target_rows=t_rows,
                          use_target_labels=lcfg.label_source == "target", need_kl=lcfg.kl_weight > 0,
                          use_checkpoint=train)

    def grid(v: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        out = torch.full((bs * nb,), fill, dtype=v.dtype, device=dev)
        out[rows] = v
        return out.reshape(bs, -1, b_size)

    ce, kl = grid(tl.ce), grid(tl.kl)
    valid = blocks.valid.reshape(bs, -1, b_size)
    loss, parts = combine(ce, kl, valid, lcfg, b_size)
    match = grid((tl.pred == tl.label), False)[..., 1:] & valid[..., 1:]
    tau = acceptance(match, blocks.keep)
    metrics = {**parts, "loss": loss.detach(), "tau_sum": tau.float().sum()}
    return RefOutput(loss, metrics, match, grid(tl.label))


# ---- fixtures -------------------------------------------------------------------------------------------

TOL = {"atol": 1e-6, "rtol": 0.0}
B = 4


@pytest.fixture(scope="module")
def target() -> TargetModel:
    model = build_tiny_model(seed=1)
    with torch.no_grad():  # non-trivial final norm, so the verifier differs from lm_head(last hidden)
        model.model.norm.weight.normal_(0.0, 0.3)
    return TargetModel(model, (1, 5))


@pytest.fixture(scope="module")
def batch_and_anchors() -> tuple[Batch, tuple[torch.Tensor, torch.Tensor]]:
    """Two samples of different lengths (right padding), loss_mask holes, kept and padding blocks, and
    blocks that run past the sequence end."""
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 510, (n,), generator=g).tolist() for n in (40, 23)]
    lm0 = [0] * 4 + [1] * 20 + [0] * 3 + [1] * 13
    lm1 = [0] * 2 + [1] * 21
    batch = collate([{"input_ids": ids[0], "loss_mask": lm0}, {"input_ids": ids[1], "loss_mask": lm1}])
    anchors = torch.tensor([[4, 9, 15, 22, 28, 37], [2, 8, 19, 21, 0, 0]])
    keep = torch.tensor([[True] * 6, [True, True, True, True, False, False]])
    return batch, (anchors, keep)


def _drafter(target: TargetModel) -> tuple[DrafterConfig, torch.nn.Module]:
    dcfg = DrafterConfig(num_layers=2, block_size=B, mask_token_id=511, sliding_window=16, max_anchors=6)
    torch.manual_seed(0)
    return dcfg, build_drafter(dcfg, target)


def _fields(tl: TokenLosses) -> list[torch.Tensor]:
    """ce, kl, pred, label (`mixed` is checked on its own)."""
    return [getattr(tl, f.name) for f in dataclasses.fields(tl) if f.name != "mixed"]


def _grads(drafter: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    named = [(n, p) for n, p in drafter.named_parameters() if p.requires_grad]
    return dict(zip([n for n, _ in named], torch.autograd.grad(loss, [p for _, p in named]), strict=True))


# ---- token_losses: values and d/dh ----------------------------------------------------------------------

@pytest.mark.parametrize("need_kl,use_target_labels", [(False, False), (True, False), (False, True),
                                                        (True, True)])
@pytest.mark.parametrize("chunk_rows", [1, 8, 11, 64])
def test_token_losses_and_grad_h_equal_reference(target: TargetModel, need_kl: bool, use_target_labels: bool,
                                                 chunk_rows: int) -> None:
    g = torch.Generator().manual_seed(1)
    r, hdim = 37, target.hidden_size
    h = torch.randn(r, hdim, generator=g, requires_grad=True)
    t_rows = torch.randn(r, hdim, generator=g)
    labels = torch.randint(0, target.vocab_size, (r,), generator=g)
    w_ce, w_kl = torch.rand(r, generator=g), torch.rand(r, generator=g)
    kw = {"chunk_rows": chunk_rows, "verifier": target.logits_at, "target_rows": t_rows,
          "use_target_labels": use_target_labels, "need_kl": need_kl}
    new = token_losses(h, labels, target.lm_head, **kw)
    ref = ref_token_losses(h, labels, lambda x: target.lm_head(x), **kw)
    for a, b in zip(_fields(new), _fields(ref), strict=True):
        torch.testing.assert_close(a, b, **TOL)
    if need_kl:
        assert ref.kl.min() > 0
    if use_target_labels:
        assert not torch.equal(ref.label, labels)

    def grad(tl: TokenLosses) -> torch.Tensor:
        loss = (w_ce * tl.ce).sum() + ((w_kl * tl.kl).sum() if need_kl else 0.0)
        return torch.autograd.grad(loss, h)[0]

    torch.testing.assert_close(grad(new), grad(ref), **TOL)


@pytest.mark.parametrize("mix", [(1.0, 0.0), (0.0, 1.0), (0.7, 1.3)])
@pytest.mark.parametrize("use_target_labels", [False, True])
def test_one_combined_gradient_equals_the_reference(target: TargetModel, mix: tuple[float, float],
                                                    use_target_labels: bool) -> None:
    """`mix`: one d/dh for ce_weight CE + kl_weight KL (the logit gradients summed before the one matmul)
    equals autograd through the reference's two terms, and ce / kl themselves carry no gradient."""
    g = torch.Generator().manual_seed(3)
    r, hdim = 29, target.hidden_size
    h = torch.randn(r, hdim, generator=g, requires_grad=True)
    t_rows = torch.randn(r, hdim, generator=g)
    labels = torch.randint(0, target.vocab_size, (r,), generator=g)
    w = torch.rand(r, generator=g)
    kw = {"chunk_rows": 8, "verifier": target.logits_at, "target_rows": t_rows,
          "use_target_labels": use_target_labels, "need_kl": mix[1] > 0}
    new = token_losses(h, labels, target.lm_head, mix=mix, **kw)
    ref = ref_token_losses(h, labels, lambda x: target.lm_head(x), **kw)
    assert new.mixed is not None and not new.ce.requires_grad and not new.kl.requires_grad
    torch.testing.assert_close(new.mixed, mix[0] * ref.ce + mix[1] * ref.kl, **TOL)
    got = torch.autograd.grad((w * new.mixed).sum(), h)[0]
    want = torch.autograd.grad((w * (mix[0] * ref.ce + mix[1] * ref.kl)).sum(), h)[0]
    torch.testing.assert_close(got, want, **TOL)


def test_no_grad_path_equals_grad_path(target: TargetModel) -> None:
    g = torch.Generator().manual_seed(2)
    h = torch.randn(19, target.hidden_size, generator=g)
    labels = torch.randint(0, target.vocab_size, (19,), generator=g)
    kw = {"chunk_rows": 8, "verifier": target.logits_at, "target_rows": torch.randn(19, target.hidden_size),
          "need_kl": True}
    with_grad = token_losses(h.clone().requires_grad_(True), labels, target.lm_head, **kw)
    with torch.no_grad():
        without = token_losses(h, labels, target.lm_head, **kw)
    for a, b in zip(_fields(with_grad), _fields(without), strict=True):
        assert torch.equal(a.detach(), b)


def test_trainable_lm_head_is_refused() -> None:
    head = torch.nn.Linear(4, 8, bias=False)
    with pytest.raises(ValueError, match="frozen"):
        token_losses(torch.randn(3, 4, requires_grad=True), torch.zeros(3, dtype=torch.long), head,
                     chunk_rows=2)


# ---- dflash_forward: loss, metrics, labels and parameter gradients -------------------------------------

CASES = {
    "ce": LossConfig(),
    "kl": LossConfig(ce_weight=0.0, kl_weight=1.0),
    "mix": LossConfig(ce_weight=0.5, kl_weight=1.0, decay_gamma=3.0),
    "dpace": LossConfig(dpace=True, dpace_alpha=0.3, kl_weight=0.5),
    "target_labels": LossConfig(label_source="target"),
    "target_labels_kl": LossConfig(label_source="target", kl_weight=0.7, dpace=True),
}


@pytest.mark.parametrize("chunk_blocks", [1, 3, 64])
@pytest.mark.parametrize("case", list(CASES))
def test_dflash_forward_equals_reference(target: TargetModel, batch_and_anchors: tuple, case: str,
                                         chunk_blocks: int) -> None:
    batch, anchors = batch_and_anchors
    lcfg = dataclasses.replace(CASES[case], chunk_blocks=chunk_blocks)
    dcfg, drafter = _drafter(target)
    new = dflash_forward(batch, target, drafter, dcfg, lcfg, anchors=anchors, use_flex=False)
    ref = ref_dflash_forward(batch, target, drafter, dcfg, lcfg, anchors=anchors, use_flex=False)
    rows = int(new.blocks.valid.sum())
    assert 0 < rows < new.blocks.valid.numel()  # padding blocks and rows past the end carry no loss
    if chunk_blocks == 3:
        assert rows % (chunk_blocks * B) != 0  # a last, shorter chunk
    torch.testing.assert_close(new.loss, ref.loss, **TOL)
    for k in ("ce", "kl", "loss", "tau_sum"):
        torch.testing.assert_close(new.metrics[k], ref.metrics[k], **TOL)
    assert torch.equal(new.matches, ref.matches)
    assert torch.equal(new.labels_used, ref.labels_used)
    g_new, g_ref = _grads(drafter, new.loss), _grads(drafter, ref.loss)
    assert g_new.keys() == g_ref.keys() and any(v.abs().max() > 0 for v in g_ref.values())
    for name in g_ref:
        torch.testing.assert_close(g_new[name], g_ref[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("case", ["ce", "target_labels_kl"])
def test_eval_forward_equals_reference(target: TargetModel, batch_and_anchors: tuple, case: str) -> None:
    batch, anchors = batch_and_anchors
    dcfg, drafter = _drafter(target)
    with torch.no_grad():
        new = dflash_forward(batch, target, drafter, dcfg, CASES[case], anchors=anchors, use_flex=False,
                             train=False)
        ref = ref_dflash_forward(batch, target, drafter, dcfg, CASES[case], anchors=anchors, use_flex=False,
                                 train=False)
    torch.testing.assert_close(new.loss, ref.loss, **TOL)
    assert torch.equal(new.matches, ref.matches)


def test_step_metrics_count_samples_and_supervised_tokens(target: TargetModel,
                                                          batch_and_anchors: tuple) -> None:
    batch, anchors = batch_and_anchors
    dcfg, drafter = _drafter(target)
    with torch.no_grad():
        out = dflash_forward(batch, target, drafter, dcfg, LossConfig(), anchors=anchors, train=False)
    assert out.metrics["samples"].item() == 2.0
    assert out.metrics["tokens"].item() == 40 + 23
    assert out.metrics["supervised_tokens"].item() == 33 + 21
    padded = copy.deepcopy(batch)
    padded.loss_mask[1, 23:] = 1  # loss_mask past the length is not supervised
    with torch.no_grad():
        out = dflash_forward(padded, target, drafter, dcfg, LossConfig(), anchors=anchors, train=False)
    assert out.metrics["supervised_tokens"].item() == 33 + 21


def test_verifier_norm_is_the_target_norm_on_its_own_device(target: TargetModel) -> None:
    assert norm_on(target.norm, torch.device("cpu")) is target.norm


# ---- feature noise --------------------------------------------------------------------------------------

def test_noise_is_drawn_from_the_seed_on_the_features_device(target: TargetModel,
                                                             batch_and_anchors: tuple) -> None:
    batch, anchors = batch_and_anchors
    dcfg, drafter = _drafter(target)
    lcfg = LossConfig(noise="gaussian", noise_std=0.5)

    def loss(**kw: Any) -> torch.Tensor:
        with torch.no_grad():
            out = dflash_forward(batch, target, drafter, dcfg, lcfg, anchors=anchors, use_flex=False, **kw)
        return out.loss

    clean = dflash_forward(batch, target, drafter, dcfg, lcfg, anchors=anchors, use_flex=False,
                           train=False).loss.detach()
    assert torch.equal(loss(noise_seed=5), loss(noise_seed=5))
    assert not torch.equal(loss(noise_seed=5), loss(noise_seed=6))
    assert not torch.equal(loss(noise_seed=5), clean)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(loss(generator=g1), loss(generator=g2))  # no seed: one drawn from the generator
    x = torch.zeros(3, 5, 8)
    seed = int(torch.randint(0, 2**63 - 1, (), generator=torch.Generator().manual_seed(3)))
    assert torch.equal(feature_noise(x, lcfg, 0.0, generator=torch.Generator().manual_seed(3)),
                       feature_noise(x, lcfg, 0.0, seed=seed))
