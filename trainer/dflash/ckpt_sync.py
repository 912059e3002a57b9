"""Checkpoints back from S3: a resume on a node whose disk lacks the run's newest checkpoint (another node,
a replaced disk) fetches it from where `train.upload_checkpoints` put it. The train launcher of each node
does this (trainer.dflash.stage.fetch_inputs) before torchrun starts any rank, so no rank waits for the
download in a barrier under NCCL's timeout.

    s3://<bucket>/<prefix>/checkpoints/step-NNNNNNN/   the files of a step dir; files.json uploaded last

An S3 step dir counts only when its files.json is there and every file it lists is there with its size:
the upload puts files.json last, after every other file is verified (trainer.dflash.checkpoint), so an
upload cut short is never chosen. Step dirs uploaded before the list existed are not fetched (nothing
says they are whole). The newest complete one is fetched when it is newer than the newest complete local
checkpoint, into a hidden dir first (trainer.data.sync: parallel, verified, resumable), checked against its
list, and renamed into place; then `latest` names it.

A multi-node run resumes from S3's newest complete checkpoint on every node (`only_remote`), the one every
node can have: node 0's disk may hold a newer step dir whose upload the loss of another node cut short,
and resuming from it there would put the nodes at different steps. Such a dir is moved aside
(`.unsynced-step-N-<UTC time>`, never deleted) with a warning. Torch-free.
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from trainer.layout import (
    FILES_LIST,
    checkpoint_problem,
    files_problem,
    latest_checkpoint,
    list_checkpoints,
    read_files_list,
)

log = logging.getLogger(__name__)

_STEP = re.compile(r"^step-(\d{7,})$")


def _step(name: str) -> int:
    m = _STEP.match(name)
    return int(m.group(1)) if m else -1


def newest_remote(client: Any, bucket: str, prefix: str) -> tuple[str, dict[str, int]] | None:
    """(step dir name, its files list) of the newest complete step dir under `prefix` (the checkpoints
    prefix), or None; each newer incomplete one is logged with the file at fault."""
    from trainer.data.sync import S3Sync
    from trainer.s3 import join_key

    objects = S3Sync(client, bucket, prefix, show_progress=False).list_remote()
    dirs: dict[str, dict[str, int]] = defaultdict(dict)
    for rel, size in objects.items():
        top, _, name = rel.partition("/")
        if _step(top) >= 0 and name and "/" not in name:
            dirs[top][name] = size
    for name in sorted(dirs, key=_step, reverse=True):
        where = f"s3://{bucket}/{join_key(prefix, name)}"
        if FILES_LIST not in dirs[name]:
            log.warning("%s has no %s (an upload under way or cut short, or one from before the list): "
                        "not fetched", where, FILES_LIST)
            continue
        body = client.get_object(Bucket=bucket, Key=join_key(prefix, name, FILES_LIST))["Body"].read()
        try:
            listed = read_files_list(body.decode("utf-8", "replace"))
        except ValueError as e:
            log.warning("%s: %s cannot be read (%s): not fetched", where, FILES_LIST, e)
            continue
        problem = files_problem({**listed, FILES_LIST: len(body)}, dirs[name])
        if problem is None and "meta.json" in listed:
            return name, listed
        log.warning("%s is incomplete (%s): not fetched", where, problem or "meta.json is not listed")
    return None


def set_aside_newer(ckpt_root: Path, step: int, where: str) -> list[Path]:
    """Move the local step dirs newer than `step` (S3's newest complete, -1 for none) aside; -> where to."""
    moved = []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for step_dir in list_checkpoints(ckpt_root):
        if _step(step_dir.name) > step:
            aside = ckpt_root / f".unsynced-{step_dir.name}-{stamp}"
            os.replace(step_dir, aside)
            moved.append(aside)
            log.warning("resume: %s is newer than %s's newest complete checkpoint, which every node resumes "
                        "from; moved aside to %s", step_dir.name, where, aside)
    if moved:
        (ckpt_root / "latest").unlink(missing_ok=True)  # latest_checkpoint falls back to the newest kept
    return moved


def fetch_newer(ckpt_root: Path, s3: Any, client: Any = None, only_remote: bool = False) -> Path | None:
    """Fetch the newest complete S3 checkpoint of the run (`s3`: its S3Config) into `ckpt_root` when no
    complete local checkpoint is as new; -> the fetched step dir, or None when there was nothing newer.
    `only_remote` (a multi-node run): local step dirs newer than that one are moved aside first."""
    from trainer.data.sync import S3Sync
    from trainer.s3 import join_key, make_client

    prefix = join_key(s3.prefix, "checkpoints")
    client = client or make_client(s3, max_pool_connections=s3.concurrency * 8 + 4)
    found = newest_remote(client, s3.bucket, prefix)
    if only_remote:
        set_aside_newer(ckpt_root, _step(found[0]) if found else -1, f"s3://{s3.bucket}/{prefix}")
    local = latest_checkpoint(ckpt_root)
    if found is None:
        log.info("no complete checkpoint under s3://%s/%s to resume from", s3.bucket, prefix)
        return None
    name, listed = found
    if local is not None and _step(local.name) >= _step(name):
        log.info("resume: the local %s is as new as s3's newest complete checkpoint (%s)", local.name, name)
        return None
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".fetch-{name}"  # kept across a crash: the next fetch skips what is there and whole
    wanted = set(listed) | {FILES_LIST}
    S3Sync(client, s3.bucket, join_key(prefix, name), concurrency=s3.concurrency, show_progress=False,
           include=wanted.__contains__).download(tmp)
    problem = checkpoint_problem(tmp)
    if problem is not None:  # the objects changed between the listing and the download
        raise RuntimeError(f"{tmp}: the checkpoint fetched from s3 is incomplete ({problem})")
    final = ckpt_root / name
    if final.exists():  # an incomplete local copy of that step (a complete one would have been newer)
        aside = ckpt_root / f".incomplete-{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        os.replace(final, aside)
        log.warning("%s was incomplete (%s); moved aside to %s", final, checkpoint_problem(aside), aside)
    os.replace(tmp, final)
    point_latest(ckpt_root, final)
    log.info("resume: fetched %s from s3://%s/%s", name, s3.bucket, join_key(prefix, name))
    return final


def point_latest(ckpt_root: Path, step_dir: Path) -> None:
    """Replace `latest` atomically with the name of `step_dir`."""
    pointer_tmp = ckpt_root / f".latest.tmp-{os.getpid()}"
    pointer_tmp.write_text(step_dir.name + "\n")
    os.replace(pointer_tmp, ckpt_root / "latest")

