"""Export a trained drafter in the layout SGLang's DFLASH speculative algorithm loads.

What SGLang expects (``sglang/srt/models/dflash.py`` + ``srt/speculative/dflash_utils.py``), started with
``--speculative-algorithm DFLASH --speculative-draft-model-path <export dir>``:

* ``config.json`` with ``architectures: ["DFlashDraftModel"]`` and Qwen3-style fields: hidden_size (must
  equal the target's: fc maps K*hidden -> hidden), num_hidden_layers, num_attention_heads,
  num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, rope_theta, max_position_embeddings,
  hidden_act "silu", vocab_size; ``layer_types`` (``full_attention`` runs as ENCODER_ONLY, i.e.
  bidirectional in the block; ``sliding_attention`` runs causal with ``sliding_window``, HF convention:
  the window includes the current token); ``block_size``; and ``dflash_config`` with
  ``mask_token_id``, ``target_layer_ids`` (0-based, the *output* of that decoder layer: SGLang adds the
  +1 when mapping to its capture points), ``num_target_layers`` and ``block_size``.
* safetensors weights named ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.{i}.self_attn.{q,k}_norm.weight``,
  ``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``layers.{i}.{input,post_attention}_layernorm.weight``,
  ``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` (a ``model.`` prefix is tolerated). No embedding
  and no lm_head: SGLang uses the target's. RMSNorms are the plain ``weight * x`` kind (init 1).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from trainer.dflash.drafter import DrafterArch


def sglang_config(arch: DrafterArch, dtype: str = "bfloat16", max_position_embeddings: int = 262144) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": arch.vocab_size,
        "tie_word_embeddings": False,
        "layer_types": list(arch.layer_types),
        "sliding_window": arch.sliding_window,
        "use_sliding_window": "sliding_attention" in arch.layer_types,
        "block_size": arch.block_size,
        "num_target_layers": arch.num_target_layers,
        "dflash_config": {
            "mask_token_id": arch.mask_token_id,
            "target_layer_ids": list(arch.target_layer_ids),
            "num_target_layers": arch.num_target_layers,
            "block_size": arch.block_size,
        },
        "torch_dtype": dtype,
    }


def export_for_sglang(weights: dict[str, torch.Tensor], arch: DrafterArch, out_dir: str | Path,
                      dtype: torch.dtype = torch.bfloat16, extra: dict[str, Any] | None = None) -> Path:
    """Write config.json + model.safetensors into `out_dir` (atomically replaced)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors = {k: v.detach().to(dtype).contiguous().cpu() for k, v in weights.items()
               if not k.startswith(("embed_tokens.", "lm_head."))}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = sglang_config(arch, str(dtype).removeprefix("torch."))
    cfg.update(extra or {})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    return out
