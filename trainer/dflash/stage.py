"""The `train` stage: train the DFlash drafter, under torchrun when the placement asks for more than one
process (`trainer.dflash.launch`: one rank per GPU, each running `python -m trainer train <resolved
config> --resume`). Heavy imports (torch) happen inside the functions.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from trainer.config import ConfigError, RunConfig, to_dict
from trainer.layout import RunLayout, latest_checkpoint, list_checkpoints

log = logging.getLogger(__name__)

EXIT_REFUSED = 1  # the data is refused, as from `doctor` and `prepare`


def torchrun_command(cfg: RunConfig, node_rank: int | None = None) -> list[str]:
    """The torchrun line the train stage runs for this resolved config (`node_rank`: this node's rank
    instead of the placement's). Writes the resolved config the line names, as the stage does."""
    import dataclasses

    from trainer.dflash.launch import resolved_launch

    p = cfg.train.placement
    if node_rank is not None:
        try:
            p = dataclasses.replace(p, node_rank=node_rank)
        except ValueError as e:
            raise ConfigError(f"--node-rank {node_rank}: {e}") from None
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, placement=p))
    if not p.launches_torchrun:
        raise ConfigError(f"--print-torchrun: run {cfg.name} trains in one process (train.placement: "
                          f"{p.nnodes} node x {p.nproc_per_node} process), the stage starts no torchrun; "
                          "set train.placement.nproc_per_node (or nnodes) for more")
    return resolved_launch(cfg)


def earlier_outputs(layout: RunLayout) -> list[Path]:
    """The train outputs an earlier run left in this run dir (step dirs, a non-empty metrics.jsonl,
    an export)."""
    found: list[Path] = list_checkpoints(layout.checkpoints)[-1:]
    if layout.metrics.is_file() and layout.metrics.stat().st_size:
        found.append(layout.metrics)
    if layout.export.is_dir() and any(layout.export.iterdir()):
        found.append(layout.export)
    return found


def refuse_restart(cfg: RunConfig) -> None:
    """`train` without --resume or --fresh on a run that trained before: refused (it would restart at
    step 0 over the earlier run's metrics, checkpoints and export), with both ways on."""
    layout = RunLayout.of(cfg)
    earlier = earlier_outputs(layout)
    if not earlier:
        return
    latest = latest_checkpoint(layout.checkpoints)
    what = f"checkpoint {latest.name}" if latest else ", ".join(p.name for p in earlier)
    raise ConfigError(
        f"run {cfg.name}: {layout.root} holds an earlier train run ({what}); --resume continues it, "
        f"--fresh moves its outputs aside to {layout.set_aside('<UTC time>')} and starts at step 0")


def set_aside(cfg: RunConfig) -> Path | None:
    """`train --fresh`: move the earlier run's train outputs (checkpoints, metrics, export, eval results,
    launch config, W&B files) into one timestamped directory of the run dir; nothing is deleted. Its path,
    or None when there was nothing to move."""
    layout = RunLayout.of(cfg)
    present = [p for p in layout.train_outputs if p.exists()]
    if not present:
        return None
    dest = layout.set_aside(time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    n = 0
    while dest.exists():  # two --fresh within one second
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    dest.mkdir(parents=True)
    for p in present:
        os.replace(p, dest / p.name)  # the same file system: a rename, never a copy
    log.info("train --fresh: the earlier run's %s moved to %s", ", ".join(p.name for p in present), dest)
    return dest


def check_metrics(cfg: RunConfig) -> None:
    """A resumed run rewrites metrics.jsonl up to its checkpoint's step; a line that is not a JSON
    object with a step is refused here, naming the line, instead of failing inside the loop."""
    path = RunLayout.of(cfg).metrics
    if not path.is_file():
        return
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError as e:
                rec = e
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                raise ConfigError(
                    f"{path}:{n}: not a metrics record (a JSON object with a step); resuming rewrites this "
                    "file, so it is refused: repair or remove that line, or start over with --fresh "
                    "(which moves the run's outputs aside)")


def preflight_device(cfg: RunConfig) -> None:
    """A cuda run on a machine without enough CUDA devices, refused once here, before torchrun starts a
    rank per GPU that would each fail with the same error."""
    t = cfg.train
    if not str(t.device).startswith("cuda"):
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = t.placement.nproc_per_node
    if have == 0:
        raise ConfigError(f"run {cfg.name}: train.device is {t.device} but this machine has no usable CUDA "
                          "device (torch.cuda.is_available() is false); run it on a GPU node, or on the CPU "
                          "with --set train.device=cpu")
    if have < need:
        raise ConfigError(f"run {cfg.name}: train.placement.nproc_per_node is {need} but this machine has "
                          f"{have} CUDA device(s); set --set train.placement.nproc_per_node={have}")


def check_target_config(cfg: RunConfig) -> None:
    """The target's config.json, when it is there, is a JSON object naming its model_type (what
    transformers' AutoConfig reads first); anything else is refused naming the file."""
    path = Path(cfg.target.path) / "config.json"
    if not path.is_file():
        return  # the loader says what is missing (or a staging step brings it)
    try:
        data = json.loads(path.read_bytes())
    except ValueError as e:
        raise ConfigError(f"{path}: the target's config.json is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the target's config.json is a JSON {type(data).__name__}, not an object "
                          "(a transformers config with model_type)")
    if not isinstance(data.get("model_type"), str):
        raise ConfigError(f"{path}: the target's config.json names no model_type (a transformers config "
                          "has one, e.g. qwen3_5)")


def preflight(cfg: RunConfig, resume: bool) -> None:
    """What the launcher checks before anything changes and before torchrun starts any rank: the device,
    the target's config.json, and (resuming) the metrics file."""
    preflight_device(cfg)
    check_target_config(cfg)
    if resume:
        check_metrics(cfg)


def fetch_inputs(cfg: RunConfig, resume: bool) -> None:
    """What each node's launcher brings from S3 before torchrun starts any rank, so that no rank waits in
    a barrier (under NCCL's collective timeout) for a download: the run's shards when `data.upload_shards`
    put them there (trainer.data.shard_fetch: fetched only when this node's copy differs, verified, swapped
    in whole), and, resuming with `train.upload_checkpoints`, the newest complete S3 checkpoint when this
    node's disk has none as new (trainer.dflash.ckpt_sync). Shards that cannot be fetched whole are
    refused (ConfigError naming the URL or file); a checkpoint fetch that fails leaves the local
    checkpoints as they are (the S3 copy stays), and the ranks' same-step check decides."""
    from trainer.data.shard_fetch import ShardFetchError, ensure_shards

    try:
        ensure_shards(cfg)
    except ShardFetchError as e:
        raise ConfigError(f"run {cfg.name}: {e}") from None
    if not (resume and cfg.train.upload_checkpoints):
        return
    from trainer.dflash.ckpt_sync import fetch_newer

    root = RunLayout.of(cfg).checkpoints
    try:
        fetch_newer(root, cfg.s3, only_remote=cfg.train.placement.nnodes > 1)
    except Exception as e:  # S3 unreachable or changing under the fetch: the local checkpoints still serve
        log.error("resume: fetching the newest checkpoint from s3 failed (%s); resuming from the local "
                  "checkpoints under %s", e, root)


def refuse_resume_changes(cfg: RunConfig) -> None:
    """Before any rank starts: a run file edited since the checkpoint the run resumes from in a way that
    checkpoint cannot continue under is refused here, once (trainer.dflash.resume_changes)."""
    from trainer.dflash.resume_changes import check_checkpoint

    found = latest_checkpoint(RunLayout.of(cfg).checkpoints)
    if found is not None:
        check_checkpoint(found, to_dict(cfg), report=False)


def stage(cfg: RunConfig, resume: bool = True) -> int:
    """The `train` stage: resumes from the run's latest checkpoint when there is one.

    0 done, 1 data refused, 130 stopped by SIGINT/SIGTERM after a checkpoint, else a failed rank's code.
    """
    from trainer.dflash.launch import apply_runtime_env, in_torchrun, launch

    if not in_torchrun():
        preflight(cfg, resume)
        fetch_inputs(cfg, resume)  # once per node, before any rank or process group exists
        if resume:
            refuse_resume_changes(cfg)
        apply_runtime_env(cfg)  # compile caches, compile workers, allocator: for this process and its ranks
        if cfg.train.placement.launches_torchrun:
            return launch(cfg)
    from trainer.data.shards import DataRefused
    from trainer.dflash.loop import train

    try:
        result = train(cfg, resume=resume)
    except DataRefused as e:
        log.error("train refused: %s", e)
        return EXIT_REFUSED
    if result.interrupted:
        log.warning("train: stopped by a signal at step %d/%d after a checkpoint%s", result.step,
                    result.total_steps, f" ({result.checkpoint})" if result.checkpoint else "")
        return 130
    log.info("train: %d/%d steps, last log %s, export %s", result.step, result.total_steps, result.last_log,
             result.export)
    return 0
