"""Target wrapper: layer ids and their +1 offset, early stop, verifier logits only at chosen rows,
the VLM checkpoint layout (model.language_model.*)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.dflash.target import TargetModel, default_layer_ids, load_target
from trainer.dflash.tiny import TINY_TARGET, build_tiny_model


def test_default_layer_ids_match_dflash_formula() -> None:
    assert default_layer_ids(64, 5) == (1, 16, 31, 46, 61)
    assert default_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B, as z-lab's checkpoints
    assert default_layer_ids(8, 2) == (1, 5)
    assert default_layer_ids(8, 1) == (4,)


def test_layer_id_k_is_output_of_decoder_layer_k() -> None:
    """Id k must be HF hidden_states[k+1] (the output of layer k), not hidden_states[k]."""
    model = build_tiny_model(seed=1)
    t = TargetModel(model, (1, 5))
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    hs = model(ids, output_hidden_states=True).hidden_states
    feats = t.features(ids).features
    h = t.hidden_size
    assert torch.allclose(feats[..., :h], hs[2], atol=1e-5)
    assert torch.allclose(feats[..., h:], hs[6], atol=1e-5)
    assert not torch.allclose(feats[..., :h], hs[1], atol=1e-3)  # the off-by-one would fail here


def test_forward_stops_after_last_needed_layer_and_never_runs_lm_head() -> None:
    model = build_tiny_model()
    t = TargetModel(model, (1, 3))
    calls: list[str] = []
    for i, layer in enumerate(t.layers):
        layer.register_forward_hook(lambda *_a, i=i: calls.append(f"layer{i}"))
    t.norm.register_forward_hook(lambda *_a: calls.append("norm"))
    t.lm_head.register_forward_hook(lambda *_a: calls.append("lm_head"))
    t.features(torch.randint(0, 512, (1, 16)))
    assert calls == ["layer0", "layer1", "layer2", "layer3"]
    calls.clear()
    out = t.features(torch.randint(0, 512, (1, 16)), need_last=True)
    assert calls == [f"layer{i}" for i in range(8)] and out.last_hidden is not None


def test_logits_at_rows_equal_full_logits() -> None:
    model = build_tiny_model(seed=2)
    t = TargetModel(model, (1, 5))
    ids = torch.randint(0, 512, (1, 20))
    full = model(ids).logits[0]
    last = t.features(ids, need_last=True).last_hidden[0]
    rows = torch.tensor([0, 7, 19])
    assert torch.allclose(t.logits_at(last[rows]), full[rows], atol=1e-5)


def test_bad_layer_ids_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"drafter.target_layer_ids \[8\] out of range"):
        TargetModel(build_tiny_model(), (1, 8))


def test_target_is_frozen(tiny_target_dir: Path) -> None:
    t = load_target(tiny_target_dir, num_draft_layers=2)
    assert t.layer_ids == (1, 5)
    assert not any(p.requires_grad for p in t.parameters())
    assert not t.model.training


def test_vlm_checkpoint_layout_loads_text_model(tmp_path: Path) -> None:
    """Real Qwen3.5/3.6 checkpoints are Qwen3_5ForConditionalGeneration with model.language_model.*."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = Qwen3_5Config(text_config={**TINY_TARGET, "vocab_size": 512},
                        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                       "out_hidden_size": 64})
    vlm = Qwen3_5ForConditionalGeneration(cfg).eval()
    vlm.save_pretrained(tmp_path / "vlm")
    t = load_target(tmp_path / "vlm", num_draft_layers=2)
    ids = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        hs = vlm.model.language_model(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.allclose(t.features(ids).features[..., :64], hs[2], atol=1e-5)


def test_missing_target_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"target.path .*no config.json"):
        load_target(tmp_path / "nope")
