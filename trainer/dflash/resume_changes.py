"""What a resume does with a run file edited since the checkpoint: each change takes effect (and is logged,
naming the field, its old and its new value) or the resume is refused naming the field. Never ignored.

Refused, because the checkpoint cannot continue under them:
- the drafter's architecture (`drafter.*` except `max_anchors`): the saved weights have its shapes and
  their meaning (block size, mask token, the target layers they read);
- `seed`, `train.batch_size`, `train.max_tokens`: the sampler's plan of the run (which rows each batch
  holds, and what the checkpoint's position in it means).
Applied: everything else, at the step the run resumes (`train.lr`, `betas`, `weight_decay`, the schedule's
shape and length, the loss weights, logging, checkpoints, eval). The schedule follows the run's progress,
so a changed `train.epochs` or `warmup_ratio` moves the learning rate at once: the log line says so.
Not compared: where things are (`run_dir`, the target's section, the data's paths, S3, W&B), how this node
runs (`train.placement`, `train.device`), and the other stages' sections.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from trainer.config_yaml import ConfigError

log = logging.getLogger(__name__)

REFUSED_PREFIXES = ("drafter.", "seed", "train.batch_size", "train.max_tokens")
REFUSED_EXCEPT = ("drafter.max_anchors",)
NOT_COMPARED = ("name", "run_dir", "stages", "target.", "data.shards", "data.heldout_shards",
                "data.completions", "data.num_workers", "s3.", "wandb.", "generate.", "train.placement.",
                "train.device", "train.progress")


def _flat(d: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            yield from _flat(v, key + ".")
        else:
            yield key, list(v) if isinstance(v, tuple) else v


def _matches(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key.startswith(p) if p.endswith(".") else key == p or key.startswith(p + ".")
               for p in prefixes)


def changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, saved value, current value) of every compared field that differs, in the config's order."""
    old, new = dict(_flat(saved)), dict(_flat(current))
    out = []
    for key in [*new, *(k for k in old if k not in new)]:
        if _matches(key, NOT_COMPARED):
            continue
        if old.get(key, "<unset>") != new.get(key, "<unset>"):
            out.append((key, old.get(key, "<unset>"), new.get(key, "<unset>")))
    return out


def check(saved: Mapping[str, Any], current: Mapping[str, Any], where: str,
          report: bool = True) -> list[tuple[str, Any, Any]]:
    """Refuse (ConfigError) a change the checkpoint at `where` cannot continue under; return the ones that
    take effect, logged when `report` (one rank of a job logs them)."""
    found = changes(saved, current)
    refused = [(k, a, b) for k, a, b in found if _matches(k, REFUSED_PREFIXES) and k not in REFUSED_EXCEPT]
    if refused:
        lines = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, a, b in refused)
        fields = ", ".join(k for k, _, _ in refused)
        raise ConfigError(f"{where} was trained with another {fields} ({lines}): "
                          f"a resume cannot continue under it. Put the run file back, or start over with "
                          f"`python -m trainer train RUN.yml --fresh` (the old run is moved aside)")
    for k, a, b in found if report else ():
        log.warning("resume: %s changed since %s: %r -> %r (takes effect now)", k, where, a, b)
    return found


def check_checkpoint(path: Path, current: Mapping[str, Any],
                     report: bool = True) -> list[tuple[str, Any, Any]]:
    """`check` against the run config saved in the step dir `path` (none saved: nothing to compare)."""
    saved = path / "config.yml"
    if not saved.is_file():
        return []
    return check(yaml.safe_load(saved.read_text()) or {}, current, str(path), report)
