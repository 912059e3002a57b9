"""The DFlash train loop: load, (resume,) step, log, checkpoint, export.

Reads like a story (torchtitan style): runtime -> data (doctor gate) -> target -> drafter (DDP)
-> optimizer/schedule -> resume -> warm-up -> steps -> final checkpoint + SGLang export.
Randomness per micro-batch (anchors, feature noise) comes from a generator seeded by
(seed, micro-batch index, rank), so a resumed run draws exactly what the uninterrupted run drew.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trainer.config import RunConfig, to_dict
from trainer.dflash import checkpoint as ckpt
from trainer.dflash import device as dev
from trainer.dflash.drafter import build_drafter
from trainer.dflash.export import export_for_sglang
from trainer.dflash.metrics import MetricsAccumulator, MetricsLogger
from trainer.dflash.optim import build_optimizer, build_scheduler
from trainer.dflash.step import collate, dflash_forward
from trainer.dflash.target import load_target
from trainer.layout import RunLayout

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    step: int
    total_steps: int
    losses: list[float]
    last_log: dict[str, Any]
    checkpoint: Path | None
    export: Path | None
    stopped_early: bool = False
    interrupted: bool = False  # stopped by SIGINT/SIGTERM (after a checkpoint)


def open_data(cfg: RunConfig) -> Any:
    """Gate on the doctor's verdict, then open the prepared shards (trainer/data owns both)."""
    from trainer.data.shards import ShardDataset, check_doctor

    path = RunLayout.of(cfg).shards
    check_doctor(path, allow_unchecked=cfg.train.allow_unchecked_data)
    return ShardDataset.open(path)


def micro_seed(seed: int, micro_index: int, rank: int) -> int:
    return (seed * 1_000_003 + micro_index * 9_973 + rank * 7_919) % (2**63 - 1)


def wrap_drafter(drafter: torch.nn.Module, rt: dev.Runtime, strategy: str) -> torch.nn.Module:
    """DDP across ranks (frozen shared embed/lm_head excluded from sync); unchanged on one process."""
    if not rt.distributed or strategy == "none":
        return drafter
    from torch.nn.parallel import DistributedDataParallel as DDP

    drafter._ddp_params_and_buffers_to_ignore = [  # type: ignore[assignment]
        n for n, _ in drafter.named_parameters() if n.startswith(("embed_tokens.", "lm_head."))]
    ids = [rt.device.index] if rt.device.type == "cuda" else None
    return DDP(drafter, device_ids=ids)


class Trainer:
    def __init__(self, cfg: RunConfig, *, resume: bool = False, dataset: Any = None) -> None:
        self.cfg, self.resume = cfg, resume
        t = cfg.train
        self.rt = dev.resolve_runtime(t.device, t.dtype, t.placement.target_gpus, t.placement.drafter_gpus)
        dev.init_distributed(self.rt)
        self.ds = dataset if dataset is not None else open_data(cfg)
        from trainer.data.sampler import BucketBatchSampler

        size = {"max_tokens": t.max_tokens} if t.max_tokens > 0 else {"batch_size": t.batch_size}
        self.sampler = BucketBatchSampler(list(self.ds.lengths), seed=cfg.seed, rank=self.rt.rank,
                                          world_size=self.rt.world_size, **size)
        per_epoch = math.ceil(len(self.sampler) / t.grad_accum)
        self.total_steps = t.max_steps if t.max_steps > 0 else per_epoch * t.epochs
        torch.manual_seed(cfg.seed)
        tdtype = cfg.target.dtype if self.rt.target_device.type == "cuda" else "float32"
        self.target = load_target(cfg.target.path,
                                  layer_ids=cfg.drafter.target_layer_ids,
                                  num_draft_layers=cfg.drafter.num_layers, dtype=tdtype,
                                  device=self.rt.target_device)
        self.core = build_drafter(cfg.drafter, self.target, self.rt.device)
        self.model = wrap_drafter(self.core, self.rt, t.placement.strategy)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = build_optimizer(self.params, t)
        self.sched = build_scheduler(self.opt, t, self.total_steps)
        log.info("rank %d/%d: drafter on %s, target on %s, %d steps", self.rt.rank, self.rt.world_size,
                 self.rt.device, self.rt.target_device, self.total_steps)
        self.step = 0
        self._saved_step = -1
        self._signal: int | None = None
        self._uploader: threading.Thread | None = None
        self.layout = RunLayout.of(cfg)
        self.ckpt_root = self.layout.checkpoints

    # -- state --------------------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write a checkpoint (rank 0) and wait for it on every rank; returns its path on rank 0."""
        self._saved_step = self.step
        weights = self.core.trainable_state_dict()
        path = None
        if self.rt.is_main:
            state = {"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                     "sampler": self.sampler.state_dict(), "rng": ckpt.rng_state(), "step": self.step}
            meta = {"epoch": self.sampler.epoch, "total_steps": self.total_steps,
                    "arch": dataclasses.asdict(self.core.arch), "world_size": self.rt.world_size}
            self.wait_for_upload()  # keep_last may delete the checkpoint the last upload is reading
            path = ckpt.save_checkpoint(self.ckpt_root, self.step, weights=weights, state=state, meta=meta,
                                        config=to_dict(self.cfg), keep_last=self.cfg.train.keep_last)
            if self.cfg.train.upload_checkpoints:
                self._upload_in_background(path)
        if self.rt.distributed:
            dev.barrier()
        return path

    def _upload(self, path: Path) -> None:
        try:
            ckpt.upload_checkpoint(path, self.cfg.s3)
        except Exception as e:  # a failed copy must not end a days-long run
            log.error("checkpoint upload of %s failed (the local checkpoint is intact; the next one "
                      "is uploaded as usual): %s", path, e)

    def _upload_in_background(self, path: Path) -> None:
        """Copy a checkpoint to S3 in a thread, so the other ranks do not wait in the save barrier for
        tens of GB to cross the network (NCCL's watchdog); one upload at a time."""
        self._uploader = threading.Thread(target=self._upload, args=(path,), name="ckpt-upload", daemon=True)
        self._uploader.start()

    def wait_for_upload(self) -> None:
        if self._uploader is not None:
            self._uploader.join()
            self._uploader = None

    def load(self, path: Path) -> None:
        weights, state, meta = ckpt.load_checkpoint(path, map_location="cpu")
        self.core.load_trainable_state_dict({k: v.to(self.rt.device) for k, v in weights.items()})
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        ckpt.set_rng_state(state["rng"])
        self.step = int(state["step"])
        self._saved_step = self.step
        log.info("resumed from %s at step %d (epoch %d)", path, self.step, meta.get("epoch", 0))

    # -- loop ---------------------------------------------------------------------------------------
    def _micro_batches(self) -> Iterator[list[int]]:
        while self.sampler.epoch < self.cfg.train.epochs or self.cfg.train.max_steps > 0:
            before = self.sampler.epoch
            yield from self.sampler
            if self.sampler.epoch == before:  # an empty epoch: nothing more to draw
                return

    def _train_step(self, it: Iterator[list[int]]) -> tuple[float, float, MetricsAccumulator] | None:
        t, rt = self.cfg.train, self.rt
        acc = MetricsAccumulator()
        loss_sum = 0.0
        for micro in range(t.grad_accum):
            idx = next(it, None)
            if idx is None:
                self.opt.zero_grad(set_to_none=True)
                return None
            batch = collate([self.ds[i] for i in idx], pad_to=self.sampler.pad_to(idx),
                            max_length=self.cfg.data.max_length, device=rt.device)
            seed = micro_seed(self.cfg.seed, self.step * t.grad_accum + micro, rt.rank)
            gen = torch.Generator().manual_seed(seed)
            sync = contextlib.nullcontext()
            if micro < t.grad_accum - 1 and hasattr(self.model, "no_sync"):
                sync = self.model.no_sync()
            with sync, dev.autocast(rt):
                out = dflash_forward(batch, self.target, self.model, self.cfg.drafter, self.cfg.loss,
                                     generator=gen, progress=self.step / max(1, self.total_steps))
                (out.loss / t.grad_accum).backward()
            loss_sum += float(out.loss.detach())
            acc.add(out.metrics)
            acc.step()
        gnorm = torch.tensor(0.0)
        if t.grad_clip > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(self.params, t.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return loss_sum / t.grad_accum, float(gnorm), acc

    # -- graceful stop ------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._signal is None:
            log.warning("rank %d: %s received: checkpoint after this step, then stop", self.rt.rank,
                        signal.Signals(signum).name)
        self._signal = signum

    def _stop_agreed(self) -> bool:
        """True on every rank once any rank got SIGINT/SIGTERM (one all-reduce per step, so all stop at
        the same step and save together)."""
        flag = torch.tensor([1.0 if self._signal is not None else 0.0], device=self.rt.device)
        return bool(dev.all_reduce_sum(flag).item() > 0)

    def run(self) -> TrainResult:
        if threading.current_thread() is not threading.main_thread():
            return self._run()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _run(self) -> TrainResult:
        cfg, t, rt = self.cfg, self.cfg.train, self.rt
        if self.resume:
            found = ckpt.latest_checkpoint(self.ckpt_root)
            if found is None:
                log.warning("--resume: no checkpoint under %s; starting from step 0", self.ckpt_root)
            else:
                self.load(found)
        lengths = sorted({self.sampler.pad_to([i]) for i in range(min(64, len(self.ds)))})
        dev.warm_up_target(rt, self.target, tuple(lengths))
        logger = MetricsLogger(self.layout.metrics, self.total_steps, self.step, enabled=rt.is_main,
                               progress=t.progress, wandb_cfg=cfg.wandb, run_name=cfg.name,
                               config=to_dict(cfg))
        it = self._micro_batches()
        window = MetricsAccumulator()
        losses: list[float] = []
        last_log: dict[str, Any] = {}
        last_ckpt: Path | None = None
        t_log = time.perf_counter()
        self.model.train()
        try:
            while self.step < self.total_steps:
                res = self._train_step(it)
                if res is None:
                    log.info("data exhausted at step %d", self.step)
                    break
                loss, gnorm, acc = res
                for k, v in acc.sums.items():
                    window.sums[k] = window.sums[k] + v if k in window.sums else v
                window.steps += acc.steps
                losses.append(loss)
                lr = self.sched.get_last_lr()[0]
                tau = float(acc.sums["tau_sum"] / acc.sums["blocks"].clamp(min=1))
                logger.step(self.step, {"loss": loss, "tau": tau, "lr": lr, "grad_norm": gnorm})
                if self.step % t.log_every == 0 or self.step == self.total_steps:
                    agg = window.reduce(rt.distributed)
                    now = time.perf_counter()
                    agg["tok_per_s"] = agg["tokens"] * rt.world_size / max(1e-9, now - t_log)
                    t_log = now
                    last_log = logger.log(self.step, agg, lr)
                if t.save_every and self.step % t.save_every == 0:
                    last_ckpt = self.save()
                if t.stop_after and self.step >= t.stop_after:
                    last_ckpt = self.save()
                    return TrainResult(self.step, self.total_steps, losses, last_log, last_ckpt, None, True)
                if self.step < self.total_steps and self._stop_agreed():
                    if self._saved_step != self.step:
                        last_ckpt = self.save()
                    return TrainResult(self.step, self.total_steps, losses, last_log, last_ckpt, None, True,
                                       interrupted=True)
            if self._saved_step != self.step:  # the same decision on every rank (save() has a barrier)
                last_ckpt = self.save()
            export = None
            if rt.is_main:
                export = export_for_sglang(self.core.trainable_state_dict(), self.core.arch,
                                           self.layout.export)
                log.info("exported the drafter for SGLang to %s", export)
            return TrainResult(self.step, self.total_steps, losses, last_log, last_ckpt, export)
        finally:
            self.wait_for_upload()  # the last checkpoint is on S3 before the stage returns
            logger.close()


def train(cfg: RunConfig, *, resume: bool = False, dataset: Any = None) -> TrainResult:
    """Train the drafter described by `cfg` (under torchrun when WORLD_SIZE > 1)."""
    try:
        return Trainer(cfg, resume=resume, dataset=dataset).run()
    finally:
        dev.destroy_distributed()
