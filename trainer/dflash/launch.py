"""The train stage under torchrun: one rank per GPU, started by the stage itself.

When ``train.placement`` asks for more than one process (``nnodes * nproc_per_node > 1``) and this process
is not already a torchrun rank, `launch` writes the resolved run config to ``<run_dir>/launch/config.yml``
and runs, with the same interpreter::

    python -m torch.distributed.run --nnodes=N --nproc-per-node=P --max-restarts=0 \\
        --shutdown-timeout=S (--standalone | --rdzv-backend=static --rdzv-endpoint=H:P --rdzv-id=ID
        --node-rank=R) -m trainer train <run_dir>/launch/config.yml --resume

- every rank resumes from the run's latest checkpoint (a relaunch continues where the run stopped);
- SIGINT / SIGTERM to this process are forwarded to torchrun, which passes them to every rank; the ranks
  agree to stop after the current step, write one checkpoint and exit 130; torchrun waits up to
  ``SHUTDOWN_TIMEOUT_S`` for them before SIGKILL. This process then returns 130 (no later stage runs);
- when a rank dies, torchrun ends the others (``--max-restarts=0``) and this process logs which rank
  died with which exit code (torchrun's "Root Cause" report) and returns that exit code (1 if unknown).
- multi-node: torchrun's static rendezvous on ``rdzv_endpoint`` (node 0 hosts the store there); each node
  runs the same unit with its own ``train.placement.node_rank``, and its ranks are exactly
  ``node_rank * nproc_per_node + local_rank``. Not c10d: its rendezvous ignores ``--node-rank`` and numbers
  the nodes by their host names (torch.distributed.elastic.rendezvous.dynamic_rendezvous,
  ``_mark_rendezvous_complete`` sorts the participants by FQDN), so global rank 0, which writes the
  checkpoints, the metrics and the export, could land on any node and not on the one that runs eval.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

import yaml

from trainer.config import RunConfig, to_dict
from trainer.layout import RunLayout

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 270  # below the unit's TimeoutStopSec (trainer_run_stop_timeout_s, 600 by default)
INTERRUPTED = 130
_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def runtime_env(cfg: RunConfig, environ: Mapping[str, str], cpus: int | None = None) -> dict[str, str]:
    """What the ranks' environment gets for a long run, each only where the environment does not set it:

    - ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` under the run directory: both default to /tmp,
      which the unit makes private (PrivateTmp=true, a new one each start), so every relaunch would compile
      every kernel again;
    - ``TORCHINDUCTOR_COMPILE_THREADS``: the node's CPUs shared between its ranks (inductor otherwise starts
      up to 32 compile workers in each rank, all at once on the first steps);
    - ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: the fused loss's last chunk and the bucket
      lengths vary from step to step, and expandable segments let the caching allocator grow a segment
      instead of fragmenting memory (torch's CUDA memory-management notes).
    """
    cache = RunLayout.of(cfg).compile_cache
    n = cpus if cpus is not None else len(os.sched_getaffinity(0))
    want = {
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_COMPILE_THREADS": str(max(1, n // cfg.train.placement.nproc_per_node)),
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    return {k: v for k, v in want.items() if k not in environ}


def apply_runtime_env(cfg: RunConfig) -> dict[str, str]:
    """Set `runtime_env` in this process (before torch compiles or touches CUDA, so it applies to this
    process and every rank it starts); returns what was set."""
    added = runtime_env(cfg, os.environ)
    os.environ.update(added)
    return added


def in_torchrun() -> bool:
    """Whether this process is a rank started by torchrun (it sets LOCAL_RANK and TORCHELASTIC_RUN_ID)."""
    return "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


def torchrun_args(cfg: RunConfig) -> list[str]:
    """torchrun's options for this run's placement (single node: --standalone, a free local port)."""
    p = cfg.train.placement
    args = [f"--nnodes={p.nnodes}", f"--nproc-per-node={p.nproc_per_node}", "--max-restarts=0",
            f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}"]
    if p.nnodes == 1:
        return [*args, "--standalone"]
    return [*args, "--rdzv-backend=static", f"--rdzv-endpoint={p.rdzv_endpoint}",
            f"--rdzv-id={p.rdzv_id or cfg.name}", f"--node-rank={p.node_rank}"]


def launch_command(cfg: RunConfig, config_path: str | Path) -> list[str]:
    """The torchrun line that runs every rank of this node on the resolved config at `config_path`."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args(cfg),
            "-m", "trainer", "train", str(config_path), "--resume"]


def write_launch_config(cfg: RunConfig) -> Path:
    """The resolved config (with every --set applied) that all ranks load."""
    path = RunLayout.of(cfg).launch_config
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    os.replace(tmp, path)
    return path


def resolved_launch(cfg: RunConfig) -> list[str]:
    """Write the resolved config (run file + overrides + --set) and return the torchrun line that runs it.

    The one builder of the launch command: the stage runs what it returns and `train --print-torchrun`
    prints it.
    """
    return launch_command(cfg, write_launch_config(cfg))


def root_cause(output: str) -> tuple[int, int, int] | None:
    """(rank, local rank, exit code) of torchrun's first observed failure, if it reported one."""
    found = _ROOT_CAUSE.findall(output.split("Root Cause", 1)[-1])
    return tuple(int(x) for x in found[0]) if found else None  # type: ignore[return-value]


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return {INTERRUPTED: "interrupted"}.get(code, "failed")


def launch(cfg: RunConfig) -> int:
    """Run the ranks under torchrun: 0 done, 130 stopped by a signal, else the failed rank's exit code."""
    cmd = resolved_launch(cfg)
    p = cfg.train.placement
    log.info("train: %d rank(s) on this node (node %d of %d): %s", p.nproc_per_node, p.node_rank, p.nnodes,
             " ".join(cmd))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # own session: a terminal's Ctrl-C reaches this process only, which forwards it once
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)
    tail: deque[str] = deque(maxlen=400)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    received: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        log.warning("train: %s received, asking every rank to checkpoint and stop",
                    signal.Signals(signum).name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT if len(received) == 1 else signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        reader.join(timeout=10)
    if rc == 0 and not received:
        log.info("train: all %d rank(s) finished", p.nproc_per_node)
        return 0
    if received:
        log.warning("train: stopped by %s; every rank checkpointed (relaunch resumes from %s)",
                    signal.Signals(received[0]).name, RunLayout.of(cfg).checkpoints)
        return INTERRUPTED
    cause = root_cause("".join(tail))
    if cause is None:
        log.error("train: torchrun exited with %d and no rank failure report; the run stopped "
                  "(relaunch resumes from the last checkpoint under %s)", rc, RunLayout.of(cfg).checkpoints)
        return rc if rc > 0 else 1
    rank, local, code = cause
    log.error("train: rank %d (local rank %d on node %d) %s with exit code %d; torchrun stopped the other "
              "ranks and the run (relaunch resumes from the last checkpoint under %s)",
              rank, local, p.node_rank, _describe(code), code, RunLayout.of(cfg).checkpoints)
    return code if code > 0 else 1
