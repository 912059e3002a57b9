"""Atomic, numbered checkpoints with full training state, a `latest` pointer and keep-last-K.

Layout under ``<run_dir>/checkpoints/``::

    step-0000100/  drafter.safetensors   trainable drafter weights (fp32 master copy), full
                   optimizer.pt          AdamW state, full and keyed by parameter name (read by rank 0 only)
                   state.pt              scheduler, sampler, RNG states, counters (small; every rank)
                   meta.json             step, epoch, tokens, the drafter architecture
                   config.yml            the resolved run config
                   files.json            written last: every other file with its size in bytes
    latest                               text file naming the newest complete step dir

A checkpoint is written into a hidden temp dir and renamed into place, then `latest` is replaced
atomically: a crash mid-save leaves the previous checkpoint as `latest`. files.json makes completeness
checkable where no rename is atomic (a copy to or from S3, a disk that lost a file): a step dir whose
listed files are not all there with their sizes is never resumed from (trainer.layout.checkpoint_problem).
Weights and optimizer state are full (unsharded) and keyed by parameter name, so any strategy (fsdp, ddp,
one process) and any world size resumes from any other. `.pt` files load with ``weights_only=True``: tensors
and plain containers only, never pickled code.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from trainer.config_yaml import ConfigError
from trainer.dflash.ckpt_sync import point_latest
from trainer.layout import (
    CHECKPOINTS_DIR,
    FILES_LIST,
    checkpoint_problem,
    latest_checkpoint,
    list_checkpoints,
    step_name,
)

log = logging.getLogger(__name__)

def step_dir_name(step: int) -> str:
    return step_name(step)


def rng_state() -> dict[str, Any]:
    from trainer.dflash import device as dev

    return {"python": random.getstate(), "torch": torch.get_rng_state(), "cuda": dev.cuda_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    from trainer.dflash import device as dev

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    dev.set_cuda_rng_state(state.get("cuda"))


def resolve_checkpoint(path: str | Path) -> Path:
    """A step dir, or a checkpoints root / run dir (-> its latest). Clear error when there is none."""
    p = Path(path)
    if (p / "meta.json").is_file():
        problem = checkpoint_problem(p)
        if problem is not None:
            raise CheckpointError(f"{p}: incomplete checkpoint: {problem}; give a complete step dir "
                                  "(or the checkpoints dir, for its newest complete one)")
        return p
    for root in (p, p / CHECKPOINTS_DIR):
        found = latest_checkpoint(root)
        if found is not None:
            return found
    raise FileNotFoundError(
        f"{p}: no checkpoint (expected a step-NNNNNNN dir with meta.json, or a dir holding them)")


def save_checkpoint(ckpt_root: Path, step: int, *, weights: dict[str, torch.Tensor], state: dict[str, Any],
                    meta: dict[str, Any], config: dict[str, Any], keep_last: int,
                    optimizer: dict[str, Any] | None = None) -> Path:
    from safetensors.torch import save_file

    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    cpu = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
    save_file(cpu, str(tmp / "drafter.safetensors"))
    torch.save(state, tmp / "state.pt")
    if optimizer is not None:
        torch.save(optimizer, tmp / "optimizer.pt")
    (tmp / "config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (tmp / "meta.json").write_text(json.dumps({**meta, "step": step}, indent=2, default=_json_default) + "\n")
    write_files_list(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    point_latest(ckpt_root, final)
    prune_checkpoints(ckpt_root, keep_last, final)
    log.info("checkpoint saved: %s", final)
    return final


def write_files_list(step_dir: Path) -> None:
    """files.json: every file of `step_dir` with its size, written last (a reader that finds it complete
    finds the files it lists complete)."""
    sizes = {p.name: p.stat().st_size for p in sorted(step_dir.iterdir())
             if p.is_file() and p.name != FILES_LIST}
    (step_dir / FILES_LIST).write_text(json.dumps({"files": sizes}, indent=2) + "\n")


def prune_checkpoints(ckpt_root: Path, keep_last: int, latest: Path) -> list[Path]:
    """Keep `latest` (the one the pointer names, even when a step dir of a higher number is there from an
    earlier run) and the `keep_last` newest complete step dirs (trainer.layout.checkpoint_problem): an
    incomplete one never takes the place of a complete one. Removed: the other complete ones, the
    incomplete ones older than `latest`, and the hidden `.fetch-step-N` dirs a cut-short S3 fetch left
    (trainer.dflash.ckpt_sync) whose step is no newer than the newest complete checkpoint. The removed
    dirs."""
    steps = list_checkpoints(ckpt_root)
    complete = [p for p in steps if checkpoint_problem(p) is None]
    keep = {latest.name, *(p.name for p in complete[-keep_last:])}
    newest = max((_step_of(p.name) for p in complete), default=-1)
    gone = [p for p in steps if p.name not in keep
            and (p in complete or _step_of(p.name) < _step_of(latest.name))]
    gone += [p for p in sorted(ckpt_root.glob(".fetch-step-*"))
             if p.is_dir() and 0 <= _step_of(p.name.removeprefix(".fetch-")) <= newest]
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
    return gone


def _step_of(name: str) -> int:
    """N of a step dir name `step-NNNNNNN`; -1 for any other name."""
    head, _, digits = name.partition("-")
    return int(digits) if head == "step" and digits.isdigit() else -1


class CheckpointError(ConfigError):
    """A checkpoint file that this release will not load (bad input: the CLI exits 2); the message names
    the file."""


def _load_pt(file: Path) -> Any:
    """torch.load with weights_only=True: tensors, numbers, strings and plain containers, never an
    arbitrary pickled object, so a checkpoint from a bucket others can write runs no code here. A file that
    holds anything else (an older layout, or a planted object) is refused, naming it."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError (via pickle) for a disallowed global
        if type(e).__name__ != "UnpicklingError" and "weights_only" not in str(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{file}: refused: it holds more than tensors and plain values ({first}). Checkpoints load "
            "without unpickling code; a file written by an older release or by someone else cannot be "
            "resumed. Start from its drafter.safetensors (weights only) or retrain"
        ) from None


def load_state(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, meta) of a step dir: the small part every rank reads."""
    return _load_pt(path / "state.pt"), load_meta(path)


def load_meta(path: Path) -> dict[str, Any]:
    """meta.json of a step dir (the drafter's architecture, the step)."""
    return json.loads((path / "meta.json").read_text())


def load_weights_and_optimizer(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, optimizer state) of a step dir, on the CPU (rank 0 reads them and broadcasts)."""
    from safetensors.torch import load_file

    opt_file = path / "optimizer.pt"
    if not opt_file.is_file():
        raise FileNotFoundError(f"{path}: no optimizer.pt (a checkpoint of an older layout: optimizer "
                                "state inside state.pt, keyed by position); resume it with the release that "
                                "wrote it")
    optim = _load_pt(opt_file)
    return load_file(str(path / "drafter.safetensors"), device="cpu"), optim


def load_weights(path: Path, map_location: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], Any]:
    """(weights, meta) of a step dir: what evaluation needs; no .pt file is read."""
    from safetensors.torch import load_file

    return load_file(str(path / "drafter.safetensors"), device=str(map_location)), load_meta(path)


def _json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def upload_checkpoint(path: Path, s3: Any) -> str:
    """Copy a step dir to ``s3://<bucket>/<prefix>/checkpoints/<step dir>/`` (`s3`: an S3Config); -> URL.
    files.json goes last, once every other file is there and verified: an S3 step dir with it is whole
    (trainer.dflash.ckpt_sync fetches no other)."""
    from trainer.data.sync import S3Sync
    from trainer.s3 import join_key, make_client

    key = join_key(s3.prefix, "checkpoints", path.name)
    client = make_client(s3, max_pool_connections=s3.concurrency * 8 + 4)
    for include in ((lambda rel: rel != FILES_LIST), (lambda rel: rel == FILES_LIST)):
        if include(FILES_LIST) and not (path / FILES_LIST).is_file():
            break  # a step dir from before the list: its files, and no list
        S3Sync(client, s3.bucket, key, concurrency=s3.concurrency, show_progress=False,
               include=include).upload(path)
    url = f"s3://{s3.bucket}/{key}"
    log.info("checkpoint uploaded: %s", url)
    return url
