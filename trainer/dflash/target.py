"""The frozen target: hidden states of the chosen layers, verifier logits only at the rows asked for.

`TargetModel` wraps any transformers causal LM loaded from a local path (Qwen3_5ForCausalLM, the VLM
layout `model.language_model.*`, Qwen3 for small runs). It never runs lm_head over the whole sequence
and it stops the forward right after the last layer it needs (a hook raises `_StopForward`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.dflash.arch import default_layer_ids


class _StopForward(Exception):
    pass


@dataclasses.dataclass
class TargetOutput:
    features: torch.Tensor  # [bs, S, n*H] concatenated hidden states of the chosen layers
    last_hidden: torch.Tensor | None  # [bs, S, H] output of the last decoder layer (before final norm)


def _find(obj: Any, *paths: str) -> Any:
    for path in paths:
        cur = obj
        for part in path.split("."):
            cur = getattr(cur, part, None)
            if cur is None:
                break
        if cur is not None:
            return cur
    return None


class TargetModel(nn.Module):
    """A frozen causal LM seen as: embeddings, decoder layers, final norm, lm_head."""

    def __init__(self, model: nn.Module, layer_ids: tuple[int, ...]) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.decoder = _find(model, "model.language_model", "model", "language_model")
        if self.decoder is None or not hasattr(self.decoder, "layers"):
            raise ValueError(f"{type(model).__name__}: cannot find the decoder (model.layers)")
        self.layers = self.decoder.layers
        self.embed_tokens: nn.Embedding = self.decoder.embed_tokens
        self.norm: nn.Module = self.decoder.norm
        self.lm_head: nn.Linear = _find(model, "lm_head")
        if self.lm_head is None:
            raise ValueError(f"{type(model).__name__}: no lm_head")
        n = len(self.layers)
        bad = [i for i in layer_ids if not 0 <= i < n]
        if bad:
            raise ValueError(
                f"drafter.target_layer_ids {bad} out of range: the target has {n} layers (0..{n - 1})")
        self.layer_ids = tuple(layer_ids)
        self.num_layers = n
        self.config = getattr(model.config, "text_config", None) or model.config

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, *, need_last: bool = False) -> TargetOutput:
        """Run the decoder up to max(layer_ids) (or to the end when `need_last`), capturing outputs."""
        captured: dict[int, torch.Tensor] = {}
        stop_at = self.num_layers - 1 if need_last else max(self.layer_ids)
        wanted = set(self.layer_ids) | ({self.num_layers - 1} if need_last else set())

        def make_hook(idx: int) -> Any:
            def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
                captured[idx] = out[0] if isinstance(out, tuple) else out
                if idx == stop_at:
                    raise _StopForward

            return hook

        handles = [self.layers[i].register_forward_hook(make_hook(i)) for i in sorted(wanted)]
        try:
            self.decoder(input_ids=input_ids, use_cache=False)
        except _StopForward:
            pass
        finally:
            for h in handles:
                h.remove()
        feats = torch.cat([captured[i] for i in self.layer_ids], dim=-1)
        return TargetOutput(feats, captured.get(self.num_layers - 1) if need_last else None)

    def logits_at(self, last_hidden_rows: torch.Tensor) -> torch.Tensor:
        """Verifier logits for selected rows only: final norm + lm_head on [..., H]."""
        return self.lm_head(self.norm(last_hidden_rows))

    @torch.no_grad()
    def full_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits over the whole sequence (the naive reference / greedy generation only)."""
        out = self.features(input_ids, need_last=True)
        return self.logits_at(out.last_hidden)


def load_target(path: str | Path, *, layer_ids: tuple[int, ...] = (), num_draft_layers: int = 5,
                dtype: str = "auto", device: torch.device | str = "cpu") -> TargetModel:
    """Load a frozen target from a local transformers checkpoint (no hub access: local_files_only)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"target.path {path}: no config.json (expected a transformers checkpoint)")
    torch_dtype = {"auto": "auto", "bfloat16": torch.bfloat16, "float16": torch.float16,
                   "float32": torch.float32}[dtype]
    # AutoModelForCausalLM maps a VLM checkpoint (Qwen3_5ForConditionalGeneration, weights under
    # model.language_model.*) to the text-only Qwen3_5ForCausalLM: the vision tower is never loaded.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
    text_cfg = getattr(model.config, "text_config", None) or model.config
    ids = layer_ids or default_layer_ids(int(text_cfg.num_hidden_layers), num_draft_layers)
    return TargetModel(model.to(device), ids)
