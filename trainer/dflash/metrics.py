"""Training metrics: per-step JSONL, aggregated log lines (loss, per-slot accuracy, tau, tok/s, ETA),
a tqdm progress bar and W&B when the run config names a project (mode offline in tests)."""
from __future__ import annotations

import json
import logging
import time
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
        out["tokens"] = float(sums.get("tokens", torch.tensor(0.0)))
        self.sums, self.steps = {}, 0
        return out


class MetricsLogger:
    """Writes metrics.jsonl (every step), logs + W&B (every log step), drives the progress bar."""

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
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")

    def log(self, step: int, agg: dict[str, Any], lr: float) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.t0
        done = max(1, step - self.start_step)
        eta = elapsed / done * (self.total - step)
        line = {**agg, "lr": lr, "elapsed_s": round(elapsed, 2), "eta_s": round(eta, 1)}
        if not self.enabled:
            return line
        tau = agg.get("tau", 0.0)
        log.info("step %d/%d loss %.4f tau %.3f acc@1 %.3f lr %.2e tok/s %.0f eta %s", step, self.total,
                 agg.get("loss", float("nan")), tau, (agg.get("slot_acc") or [0.0])[0], lr,
                 agg.get("tok_per_s", 0.0), _fmt_eta(eta))
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{agg.get('loss', 0):.4f}", tau=f"{tau:.2f}",
                                 tok_s=f"{agg.get('tok_per_s', 0):.0f}")
        if self.wandb is not None:
            flat = {f"train/{k}": v for k, v in line.items() if not isinstance(v, list)}
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
