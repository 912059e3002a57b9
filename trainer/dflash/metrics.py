"""Training metrics: per-step JSONL, aggregated log lines (loss, per-slot accuracy, tau, throughput, MFU,
ETA), a tqdm progress bar and W&B when the run config names a project (mode offline in tests).

The meter counts what the ranks really processed, each token once: every step sums the samples, tokens,
supervised tokens and model FLOPs of all ranks' micro-batches, and divides by the step's wall time. MFU is
those FLOPs over the GPUs' dense bf16 peak (`trainer.dflash.device.peak_tflops`, or
train.placement.gpu_peak_tflops).

Nothing is read back from the GPU between two log steps: each step's loss, grad norm, tau and counts stay
device tensors (`PendingSteps`), and on a log step (and before a checkpoint) they are summed over the ranks
in one all-reduce, copied to the host in one copy and written as that many metrics.jsonl lines. The host
therefore runs ahead of the GPU between log lines: a line's step_time_s is the host's time for that step,
and the log line's throughput and MFU, which end in that copy, are exact over the window.
"""
from __future__ import annotations

import json
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from trainer.dflash import device as dev

log = logging.getLogger(__name__)


class MetricsAccumulator:
    """Sums the step metrics between two log lines (optionally all-reduced across ranks)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for k, v in metrics.items():
            v = v.detach().float()
            self.sums[k] = self.sums[k] + v if k in self.sums else v.clone()

    def step(self) -> None:
        self.steps += 1

    def reduce(self, distributed: bool) -> dict[str, Any]:
        sums = dict(self.sums)
        if distributed:
            for k in sums:
                dev.all_reduce_sum(sums[k])
        micro = max(1, self.steps)
        out: dict[str, Any] = {}
        ws = dev.world_size() if distributed else 1
        for k in ("loss", "ce", "kl"):
            if k in sums:
                out[k] = float(sums[k]) / (micro * ws)
        if "slot_count" in sums:
            acc = sums["slot_correct"] / sums["slot_count"].clamp(min=1)
            out["slot_acc"] = [round(float(a), 4) for a in acc]
        if "blocks" in sums:
            out["tau"] = float(sums["tau_sum"] / sums["blocks"].clamp(min=1))
        self.sums, self.steps = {}, 0
        return out


COUNTS = ("samples", "tokens", "supervised_tokens", "flops")


class Meter:
    """Throughput, MFU and ETA from what every rank processed, each token counted once."""

    def __init__(self, flops: Any, peak_tflops: float | None, world_size: int, device: Any = None) -> None:
        self.flops, self.peak, self.world_size, self.device = flops, peak_tflops, world_size, device
        self.totals = dict.fromkeys(COUNTS, 0.0)  # over the whole run (kept in checkpoints)
        self.window = dict.fromkeys((*COUNTS, "seconds", "steps"), 0.0)  # since the last log line
        self.recent: deque[float] = deque(maxlen=50)  # step times, for the ETA
        self.t_last = time.perf_counter()
        self.t0 = self.t_last

    @classmethod
    def of(cls, cfg: Any, target_config: Any, arch: Any, rt: dev.Runtime) -> Meter:
        from trainer.dflash.plan import FlopCounter

        peak = cfg.train.placement.gpu_peak_tflops or dev.peak_tflops(rt.device)
        return cls(FlopCounter.of(cfg, target_config, arch), peak or None, rt.world_size, rt.device)

    def count(self, out: Any, lengths: torch.Tensor) -> torch.Tensor:
        """This rank's counts of one micro-batch (a `StepOutput` and its samples' real lengths) as a float64
        vector on the drafter's device: samples, tokens, supervised tokens, FLOPs. FLOPs count each sample at
        its real length with its kept blocks (`FlopCounter.per_sample`): padding adds none."""
        kept = out.blocks.keep.sum(1).double()
        real = lengths.to(kept.device, non_blocking=True).double()
        m = out.metrics
        return torch.stack([m["samples"].double(), m["tokens"].double(), m["supervised_tokens"].double(),
                            self.flops.per_sample(real, kept).sum()])

    def end_step(self) -> float:
        """Time a step on the host (no sync): seconds since the previous one ended."""
        now = time.perf_counter()
        dt, self.t_last = now - self.t_last, now
        self.window["seconds"] += dt
        self.window["steps"] += 1
        self.recent.append(dt)
        return dt

    def add(self, counts: list[float], seconds: float) -> dict[str, Any]:
        """A step's counts summed over the ranks (read back on a log step) into the totals: its record."""
        named = dict(zip(COUNTS, counts, strict=True))
        for k, v in named.items():
            self.totals[k] += v
            self.window[k] += v
        rec = {k: (int(v) if k != "flops" else v) for k, v in named.items()}
        return {**rec, "step_time_s": round(seconds, 4), "mfu": self.mfu(named["flops"], seconds)}

    def mfu(self, flops: float, seconds: float) -> float | None:
        if not self.peak or seconds <= 0:
            return None
        return round(flops / (seconds * self.world_size * self.peak * 1e12), 4)

    def eta(self, steps_left: int) -> float:
        return sum(self.recent) / max(1, len(self.recent)) * max(0, steps_left)

    def rates(self, steps_left: int) -> dict[str, Any]:
        """The window's rates since the last call (samples/s, tokens/s, supervised tokens/s, MFU, ETA)."""
        w, secs = self.window, max(1e-9, self.window["seconds"])
        out = {"samples_per_s": round(w["samples"] / secs, 3), "tokens_per_s": round(w["tokens"] / secs, 1),
               "supervised_tokens_per_s": round(w["supervised_tokens"] / secs, 1),
               "avg_step_time_s": round(secs / max(1.0, w["steps"]), 4), "mfu": self.mfu(w["flops"], secs),
               "eta_s": round(self.eta(steps_left), 1), "elapsed_s": round(time.perf_counter() - self.t0, 2)}
        self.window = dict.fromkeys(self.window, 0.0)
        return out

    def restart_clock(self) -> None:
        """Start timing now (after loading, warm-up and other one-off work)."""
        self.t_last = time.perf_counter()

    def state_dict(self) -> dict[str, float]:
        return dict(self.totals)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.totals.update({k: float(v) for k, v in state.items() if k in self.totals})


class PendingSteps:
    """The steps since the last log line, as device tensors until `flush` reads them all at once."""

    def __init__(self) -> None:
        self.items: list[tuple[int, torch.Tensor, torch.Tensor, dict[str, Any]]] = []

    def add(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, acc: MetricsAccumulator,
            counts: torch.Tensor, **host: Any) -> None:
        """One step: its loss and grad norm, its accumulated metrics (for tau), this rank's counts (summed
        over the ranks at the flush) and what the host already knows (lr, progress, step time ...)."""
        vals = torch.stack([loss.detach().float().reshape(()), grad_norm.detach().float().reshape(()),
                            acc.sums["tau_sum"].float(), acc.sums["blocks"].float()])
        self.items.append((step, vals, counts, host))

    def flush(self, meter: Meter, distributed: bool) -> list[tuple[int, dict[str, Any]]]:
        """(step, metrics.jsonl record) of every pending step: one all-reduce of the counts when
        distributed (a collective: every rank flushes on the same steps), one copy to the host."""
        if not self.items:
            return []
        vals = torch.stack([v for _, v, _, _ in self.items])
        counts = torch.stack([c for _, _, c, _ in self.items]).to(vals.device)
        if distributed:
            dev.all_reduce_sum(counts)
        rows = torch.cat([vals.double(), counts], 1).cpu().tolist()
        out = []
        for (step, _, _, host), row in zip(self.items, rows, strict=True):
            loss, gnorm, tau_sum, blocks = row[:4]
            seconds, eta = host.pop("seconds"), host.pop("eta_s")
            rec = {"loss": loss, "tau": tau_sum / max(1.0, blocks), "lr": host.pop("lr"), "grad_norm": gnorm,
                   **host, **meter.add(row[4:], seconds), "eta_s": eta}
            out.append((step, rec))
        self.items = []
        return out


class MetricsLogger:
    """Writes metrics.jsonl (a line per step, written on log steps), logs + W&B (every log step), drives
    the progress bar."""

    def __init__(self, path: Path, total_steps: int, start_step: int, *, enabled: bool, progress: bool,
                 wandb_cfg: Any = None, run_name: str = "", config: dict[str, Any] | None = None) -> None:
        """`path`: the metrics file (`RunLayout.metrics`); W&B keeps its files next to it."""
        self.enabled = enabled
        self.path = path
        run_dir = path.parent
        self.total = total_steps
        self.start_step = start_step
        self.t0 = time.perf_counter()
        self.bar = None
        self.wandb = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self._truncate_after(start_step)
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                            desc="train")
        if wandb_cfg is not None and wandb_cfg.project and wandb_cfg.mode != "disabled":
            import wandb

            self.wandb = wandb.init(project=wandb_cfg.project, entity=wandb_cfg.entity or None,
                                    mode=wandb_cfg.mode, name=run_name, tags=list(wandb_cfg.tags),
                                    dir=str(run_dir), config=config, resume="allow", id=run_name or None)

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines logged after the checkpoint (they will be recomputed identically)."""
        if not self.path.exists():
            return
        keep = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
        self.path.write_text("".join(ln + "\n" for ln in keep))

    def step(self, step: int, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps({"step": step, **record}) + "\n")
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")

    def tick(self) -> None:
        """A step is done: the progress bar moves (its loss is shown when the step's line is written)."""
        if self.bar is not None:
            self.bar.update(1)

    def log(self, step: int, agg: dict[str, Any], lr: float) -> dict[str, Any]:
        """A log line (and W&B) with the window's loss, tau, throughput, MFU and ETA (from the Meter)."""
        line = {**agg, "lr": lr}
        if not self.enabled:
            return line
        tau, mfu = agg.get("tau", 0.0), agg.get("mfu")
        log.info("step %d/%d loss %.4f tau %.3f acc@1 %.3f lr %.2e | %.2f samples/s %.0f tok/s "
                 "(%.0f supervised) %.3f s/step MFU %s | eta %s", step, self.total,
                 agg.get("loss", float("nan")), tau, (agg.get("slot_acc") or [0.0])[0], lr,
                 agg.get("samples_per_s", 0.0), agg.get("tokens_per_s", 0.0),
                 agg.get("supervised_tokens_per_s", 0.0), agg.get("avg_step_time_s", 0.0),
                 "n/a" if mfu is None else f"{100 * mfu:.1f}%", _fmt_eta(agg.get("eta_s", 0.0)))
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{agg.get('loss', 0):.4f}", tau=f"{tau:.2f}",
                                 tok_s=f"{agg.get('tokens_per_s', 0):.0f}")
        if self.wandb is not None:
            flat = {f"train/{k}": v for k, v in line.items() if not isinstance(v, list) and v is not None}
            for i, a in enumerate(agg.get("slot_acc") or []):
                flat[f"train/acc_slot{i + 1}"] = a
            self.wandb.log(flat, step=step)
        return line

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None:
            self.wandb.finish()


def _fmt_eta(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"
