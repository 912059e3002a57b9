"""The DFlash train loop: load, (resume,) step, log, checkpoint, export.

Reads like a story (torchtitan style): runtime -> data (doctor gate) -> target -> drafter (DDP)
-> optimizer/schedule -> resume -> warm-up (target, then every batch shape compiled) -> steps -> final
checkpoint + SGLang export.
Randomness per micro-batch (anchors, feature noise) comes from a generator seeded by
(seed, micro-batch index, rank), so a resumed run draws exactly what the uninterrupted run drew.
Between log steps nothing waits for the GPU: batches are collated and their blocks worked out on the host,
metrics stay device tensors until the log step reads them (`PendingSteps`), and the ranks agree on a stop
without a per-step sync (`StopVote`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trainer.config import RunConfig, to_dict
from trainer.dflash import checkpoint as ckpt
from trainer.dflash import device as dev
from trainer.dflash import parallel, resume_changes
from trainer.dflash.buckets import batch_shapes, bucket_bounds
from trainer.dflash.drafter import build_drafter
from trainer.dflash.export import export_for_sglang
from trainer.dflash.metrics import Meter, MetricsAccumulator, MetricsLogger, PendingSteps
from trainer.dflash.optim import ProgressSchedule, build_optimizer
from trainer.dflash.step import collate, dflash_forward
from trainer.dflash.stop import StopVote
from trainer.dflash.target import load_target
from trainer.dflash.warmup import compile_sweep, sweep_batch
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


class Trainer:
    def __init__(self, cfg: RunConfig, *, resume: bool = False, dataset: Any = None) -> None:
        self.cfg, self.resume = cfg, resume
        t = cfg.train
        self.rt = dev.resolve_runtime(t.device, t.dtype, t.placement.target_gpus, t.placement.drafter_gpus)
        dev.init_distributed(self.rt, t.placement.timeout_min)
        self.ds = dataset if dataset is not None else open_data(cfg)
        from trainer.data.sampler import BucketBatchSampler

        size = {"max_tokens": t.max_tokens} if t.max_tokens > 0 else {"batch_size": t.batch_size}
        lengths = list(self.ds.lengths)
        self.sampler = BucketBatchSampler(lengths, seed=cfg.seed, rank=self.rt.rank,
                                          world_size=self.rt.world_size,
                                          boundaries=bucket_bounds(lengths, cfg.data.max_length), **size)
        self.total_steps = self._total_steps(0)
        torch.manual_seed(cfg.seed)
        tdtype = cfg.target.dtype if self.rt.target_device.type == "cuda" else "float32"
        self.target = load_target(cfg.target.path,
                                  layer_ids=cfg.drafter.target_layer_ids,
                                  num_draft_layers=cfg.drafter.num_layers, dtype=tdtype,
                                  device=self.rt.target_device)
        self.core = build_drafter(cfg.drafter, self.target, self.rt.device)
        self.model = parallel.wrap(self.core, self.rt, t.placement.strategy)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = build_optimizer(self.params, t)
        self.sched = ProgressSchedule(self.opt, t)
        self.meter = Meter.of(cfg, self.target.config, self.core.arch, self.rt)
        log.info("rank %d/%d: drafter on %s (%s), target on %s, %d steps", self.rt.rank, self.rt.world_size,
                 self.rt.device, t.placement.strategy if self.rt.distributed else "one process",
                 self.rt.target_device, self.total_steps)
        self.step = 0
        self._saved_step = -1
        self._signal: int | None = None
        self._uploader: threading.Thread | None = None
        self.layout = RunLayout.of(cfg)
        self.ckpt_root = self.layout.checkpoints
        self.pending = PendingSteps()  # the steps since the last log line, read back on the next one
        self.losses: list[float] = []
        self._logger: MetricsLogger | None = None

    def _total_steps(self, done: int) -> int:
        """Optimizer steps of the run: `done` plus what the sampler has left (train.max_steps caps it)."""
        t = self.cfg.train
        if t.max_steps > 0:
            return t.max_steps
        left = self.sampler.remaining() + len(self.sampler) * max(0, t.epochs - self.sampler.epoch - 1)
        if self.sampler.epoch >= t.epochs:
            left = 0
        return done + math.ceil(left / t.grad_accum)

    def _progress(self) -> tuple[float, float]:
        """The run's progress (0..1) before and after the next optimizer step. With train.max_steps, in
        steps; else in batches consumed over all ranks (the sampler's count, the same on any world size),
        so the schedule and the noise annealing follow one curve whatever the number of ranks, also across
        a resume on another number."""
        t = self.cfg.train
        if t.max_steps > 0:
            return self.step / t.max_steps, (self.step + 1) / t.max_steps
        total = max(1, t.epochs * self.sampler.batches_per_epoch)
        done = self.sampler.batches_done
        return done / total, (done + t.grad_accum * self.rt.world_size) / total

    # -- state --------------------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write a checkpoint (rank 0) and wait for it on every rank; returns its path on rank 0."""
        self._flush()  # the metrics lines up to the checkpoint's step (a resume starts after them)
        self._saved_step = self.step
        weights, optim = parallel.full_state(self.model, self.opt, self.rt)  # a collective
        path = None
        if self.rt.is_main:
            state = {"scheduler": {"lr": self.sched.last_lr, "progress": self._progress()[0]},
                     "sampler": self.sampler.state_dict(),
                     "rng": ckpt.rng_state(), "step": self.step, "meter": self.meter.state_dict()}
            meta = {"epoch": self.sampler.epoch, "total_steps": self.total_steps,
                    "arch": dataclasses.asdict(self.core.arch), "world_size": self.rt.world_size,
                    "strategy": self.cfg.train.placement.strategy}
            self.wait_for_upload()  # keep_last may delete the checkpoint the last upload is reading
            path = ckpt.save_checkpoint(self.ckpt_root, self.step, weights=weights, state=state, meta=meta,
                                        config=to_dict(self.cfg), keep_last=self.cfg.train.keep_last,
                                        optimizer=optim)
            if self.cfg.train.upload_checkpoints:
                self._upload_in_background(path)
        if self.rt.distributed:
            dev.barrier()
        return path

    def _check_same_step(self) -> None:
        """Every rank resumes at one step: ranks that read different checkpoints (one node's disk newer
        than S3 and another's) would train on different samplers and schedules, so that is refused."""
        if not self.rt.distributed:
            return
        s = float(self.step)
        sums = dev.all_reduce_sum(torch.tensor([s, s * s], dtype=torch.float64, device=self.rt.device))
        n = self.rt.world_size
        if abs(sums[0].item() ** 2 - n * sums[1].item()) > 0.5:  # equal steps iff (sum s)^2 = n sum s^2
            raise ckpt.CheckpointError(
                f"rank {self.rt.rank} resumes at step {self.step} but the ranks' steps differ (mean "
                f"{sums[0].item() / n:g}): the nodes' checkpoints under {self.ckpt_root} differ; give every "
                "node the same newest checkpoint (train.upload_checkpoints fetches it from S3)")

    def _check_same_data(self) -> None:
        """Every rank trains on the same data: each node reads its own copy of the shards (fetched from
        S3, or prepared there), and a copy fetched before node 0 replaced it would train the ranks on
        different samples. Compared by what the manifests say the data is (trainer.data.shard_fetch
        `content`: the files' sizes and sha256 and the doctor's verdict), over all ranks."""
        if not self.rt.distributed:
            return
        from trainer.data.shard_fetch import content
        from trainer.data.shards import MANIFEST

        path = self.layout.shards / MANIFEST
        try:
            what = json.dumps(content(json.loads(path.read_bytes()), str(path)), sort_keys=True)
        except (OSError, ValueError, RuntimeError):
            what = f"no readable manifest at {path}"
        mine = float(int(hashlib.sha256(what.encode()).hexdigest()[:10], 16))  # 40 bits: exact in float64
        total = dev.all_reduce_sum(torch.tensor([mine], dtype=torch.float64, device=self.rt.device))
        differs = float(total[0].item() != self.rt.world_size * mine)
        if dev.all_reduce_sum(torch.tensor([differs], dtype=torch.float64, device=self.rt.device))[0].item():
            from trainer.data.shards import DataRefused

            raise DataRefused(
                f"the ranks' shards differ (rank {self.rt.rank}: {path}, data {int(mine):010x}): a node "
                "holds a stale or other copy; give every node node 0's (data.upload_shards uploads them on "
                "node 0, and each node's launcher fetches them) and launch again")

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
        """Resume from a checkpoint of any strategy and world size (rank 0 reads the weights and the
        optimizer state and broadcasts them; every rank reads the small state file)."""
        # a run file edited since: applied (logged by the first rank) or refused, never ignored
        resume_changes.check_checkpoint(path, to_dict(self.cfg), report=self.rt.is_main)
        state, meta = ckpt.load_state(path)
        weights, optim = ckpt.load_weights_and_optimizer(path) if self.rt.is_main else ({}, {})
        parallel.load_full_state(self.model, self.opt, self.rt, weights, optim)
        self.sched.apply_hyperparameters()  # the run file's betas and weight decay, not the checkpoint's
        self.sampler.load_state_dict(state["sampler"])
        ckpt.set_rng_state(state["rng"])
        self.step = int(state["step"])
        self._saved_step = self.step
        self.meter.load_state_dict(state.get("meter", {}))
        # the steps left are counted in this world size's steps (and the run file's epochs / max_steps);
        # the schedule follows the batches consumed, so it goes on where it was
        self.total_steps = self._total_steps(self.step)
        saved_world = int(meta.get("world_size", self.rt.world_size))
        if saved_world != self.rt.world_size:
            log.info("resumed %s on %d rank(s) (saved on %d): %d steps left", path.name, self.rt.world_size,
                     saved_world, self.total_steps - self.step)
        log.info("resumed from %s at step %d (epoch %d)", path, self.step, meta.get("epoch", 0))

    # -- loop ---------------------------------------------------------------------------------------
    def _micro_batches(self) -> Iterator[list[int]]:
        while self.sampler.epoch < self.cfg.train.epochs or self.cfg.train.max_steps > 0:
            before = self.sampler.epoch
            yield from self.sampler
            if self.sampler.epoch == before:  # an empty epoch: nothing more to draw
                return

    def _train_step(self, it: Iterator[list[int]]
                    ) -> tuple[torch.Tensor, torch.Tensor, MetricsAccumulator, torch.Tensor] | None:
        """One optimizer step over grad_accum micro-batches: (loss, grad norm, metrics, this rank's
        counts for the meter), all device tensors: nothing here waits for the GPU."""
        t, rt = self.cfg.train, self.rt
        acc = MetricsAccumulator()
        counts = torch.zeros(4, dtype=torch.float64, device=rt.device)
        loss_sum = torch.zeros((), device=rt.device)
        start, end = self._progress()
        self.sched.set(start, end)
        for micro in range(t.grad_accum):
            idx = next(it, None)
            if idx is None:
                self.opt.zero_grad(set_to_none=True)
                return None
            # on the host: dflash_forward works out the blocks there and copies them over without a sync
            batch = collate([self.ds[i] for i in idx], pad_to=self.sampler.pad_to(idx),
                            max_length=self.cfg.data.max_length)
            seed = micro_seed(self.cfg.seed, self.step * t.grad_accum + micro, rt.rank)
            gen = torch.Generator().manual_seed(seed)
            with parallel.gradient_sync(self.model, micro == t.grad_accum - 1), dev.autocast(rt):
                out = dflash_forward(batch, self.target, self.model, self.cfg.drafter, self.cfg.loss,
                                     generator=gen, noise_seed=seed,
                                     progress=start)
                (out.loss / t.grad_accum).backward()
            loss_sum += out.loss.detach()
            acc.add(out.metrics)
            acc.step()
            counts += self.meter.count(out, batch.lengths)
        gnorm = (parallel.clip_grad_norm(self.params, t.grad_clip) if t.grad_clip > 0
                 else torch.zeros((), device=rt.device))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return loss_sum / t.grad_accum, gnorm, acc, counts

    def _flush(self, steps_left: int | None = None) -> dict[str, Any]:
        """Write the pending steps' metrics lines (a collective when distributed: every rank calls it on
        the same steps); with `steps_left`, on a log step, the window's rates go into the last line and are
        returned."""
        records = self.pending.flush(self.meter, self.rt.distributed)
        rates = self.meter.rates(steps_left) if steps_left is not None else {}
        if records:
            records[-1][1].update(rates)
        for step, record in records:
            self.losses.append(record["loss"])
            if self._logger is not None:
                self._logger.step(step, record)
        return rates

    def _compile_all_shapes(self, shapes: list[tuple[int, int]]) -> None:
        """Compile flex attention for every batch shape before step 1 (`trainer.dflash.warmup`); nothing
        when it is not compiled (CPU)."""
        if not dev.flex_compiled(self.rt.device):
            return
        cfg, rt = self.cfg, self.rt

        def one(rows: int, length: int) -> None:
            batch, anchors = sweep_batch(rows, length, cfg.drafter.max_anchors)
            with dev.autocast(rt):
                out = dflash_forward(batch, self.target, self.model, cfg.drafter, cfg.loss, anchors=anchors,
                                     noise_seed=0)
                out.loss.backward()
            self.opt.zero_grad(set_to_none=True)
            dev.synchronize(rt.device)

        total = compile_sweep(shapes, one, log.info if rt.is_main else log.debug)
        if rt.is_main:
            log.info("compiled %d batch shapes in %.0f s", len(shapes), total)

    # -- graceful stop ------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._signal is None:
            log.warning("rank %d: %s received: checkpoint after this step, then stop", self.rt.rank,
                        signal.Signals(signum).name)
        self._signal = signum

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
        if self.resume:  # the launcher fetched a newer S3 checkpoint, if any (trainer.dflash.stage)
            found = ckpt.latest_checkpoint(self.ckpt_root)
            if found is None:
                log.warning("--resume: no checkpoint under %s; starting from step 0", self.ckpt_root)
            else:
                self.load(found)
            self._check_same_step()
        self._check_same_data()
        shapes = batch_shapes(self.sampler.shapes(), cfg.data.max_length)
        dev.configure_compile(num_shapes=len(shapes))  # one flex compilation per batch shape, never more
        dev.warm_up_target(rt, self.target, tuple(sorted({n for _, n in shapes})))
        self.model.train()
        self._compile_all_shapes(shapes)
        logger = self._logger = MetricsLogger(self.layout.metrics, self.total_steps, self.step,
                                              enabled=rt.is_main, progress=t.progress, wandb_cfg=cfg.wandb,
                                              run_name=cfg.name, config=to_dict(cfg))
        it = self._micro_batches()
        window = MetricsAccumulator()
        vote = StopVote(rt.device, rt.distributed)
        losses = self.losses
        last_log: dict[str, Any] = {}
        last_ckpt: Path | None = None
        self.meter.restart_clock()
        try:
            while self.step < self.total_steps:
                res = self._train_step(it)
                if res is None:
                    log.info("data exhausted at step %d", self.step)
                    break
                loss, gnorm, acc, counts = res
                for k, v in acc.sums.items():
                    window.sums[k] = window.sums[k] + v if k in window.sums else v
                window.steps += acc.steps
                lr = self.sched.last_lr
                seconds = self.meter.end_step()
                stop = vote(self._signal is not None)
                left = self.total_steps - self.step
                self.pending.add(self.step, loss, gnorm, acc, counts, lr=lr,
                                 progress=round(self._progress()[0], 6), total_steps=self.total_steps,
                                 seconds=seconds, eta_s=round(self.meter.eta(left), 1))
                logger.tick()
                if self.step % t.log_every == 0 or self.step == self.total_steps:
                    rates = self._flush(left)
                    last_log = logger.log(self.step, {**window.reduce(rt.distributed), **rates}, lr)
                if t.save_every and self.step % t.save_every == 0:
                    last_ckpt = self.save()
                if self.step < self.total_steps and stop:
                    if self._saved_step != self.step:
                        last_ckpt = self.save()
                    return TrainResult(self.step, self.total_steps, losses, last_log, last_ckpt, None, True,
                                       interrupted=True)
            self._flush()  # data exhausted before the last log step
            if self._saved_step != self.step:  # the same decision on every rank (save() has a barrier)
                last_ckpt = self.save()
            export = None
            weights = parallel.full_weights(self.model, rt)  # a collective: every rank
            if rt.is_main:
                export = export_for_sglang(weights, self.core.arch, self.layout.export)
                log.info("exported the drafter for SGLang to %s", export)
            return TrainResult(self.step, self.total_steps, losses, last_log, last_ckpt, export)
        finally:
            self.wait_for_upload()  # the last checkpoint is on S3 before the stage returns
            logger.close()
            self._logger = None


def train(cfg: RunConfig, *, resume: bool = False, dataset: Any = None) -> TrainResult:
    """Train the drafter described by `cfg` (under torchrun when WORLD_SIZE > 1)."""
    ok = False
    try:
        result = Trainer(cfg, resume=resume, dataset=dataset).run()
        ok = True
        return result
    finally:
        dev.destroy_distributed(ok)
