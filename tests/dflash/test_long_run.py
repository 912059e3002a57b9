"""What a multi-day run needs from its environment: a process-group timeout from the run file, torch.compile's
caches under the run directory (the unit's /tmp is private and new at each start), compile workers shared
between a node's ranks, and the CUDA allocator's expandable segments; the user's own environment wins."""
from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.config import load_run_config
from trainer.config_yaml import ConfigError
from trainer.dflash import device as dev
from trainer.dflash.launch import apply_runtime_env, runtime_env
from trainer.layout import RunLayout

ENV_KEYS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS",
            "PYTORCH_CUDA_ALLOC_CONF")


def test_runtime_env_puts_the_caches_under_the_run_and_shares_the_cpus(make_run: Callable[..., Path]) -> None:
    cfg = load_run_config(make_run(), ["train.placement.nproc_per_node=8"])
    env = runtime_env(cfg, {}, cpus=64)
    cache = RunLayout.of(cfg).root / "cache"
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
                   "TRITON_CACHE_DIR": str(cache / "triton"),
                   "TORCHINDUCTOR_COMPILE_THREADS": "8",
                   "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    # fewer CPUs than ranks: one compile worker each, never 0
    assert runtime_env(cfg, {}, cpus=4)["TORCHINDUCTOR_COMPILE_THREADS"] == "1"


def test_runtime_env_leaves_what_the_environment_sets(make_run: Callable[..., Path]) -> None:
    cfg = load_run_config(make_run())
    mine = {"TRITON_CACHE_DIR": "/scratch/triton", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    env = runtime_env(cfg, mine, cpus=2)
    assert set(env) == {"TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"}


def test_apply_runtime_env_sets_this_process(make_run: Callable[..., Path],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    cfg = load_run_config(make_run())
    added = apply_runtime_env(cfg)
    assert set(added) == set(ENV_KEYS)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(RunLayout.of(cfg).compile_cache / "inductor")
    # inductor reads the variable when it looks for its cache, so kernels land under the run
    from torch._inductor.runtime.runtime_utils import cache_dir

    assert cache_dir() == os.environ["TORCHINDUCTOR_CACHE_DIR"]


def test_process_group_timeout_comes_from_the_run_file(make_run: Callable[..., Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_run_config(make_run(), ["train.placement.timeout_min=90"])
    assert cfg.train.placement.timeout_min == 90
    seen: dict[str, Any] = {}
    # a spy in place of torch's init_process_group: two real ranks would only show that torch accepts it
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: seen.update(kw))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    rt = dev.Runtime(device=torch.device("cpu"), dtype=torch.float32, target_device=torch.device("cpu"),
                     rank=0, local_rank=0, world_size=2)
    dev.init_distributed(rt, cfg.train.placement.timeout_min)
    assert seen == {"backend": "gloo", "timeout": datetime.timedelta(minutes=90)}


def test_a_timeout_of_zero_is_refused(make_run: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError, match=r"train\.placement\.timeout_min must be > 0"):
        load_run_config(make_run(), ["train.placement.timeout_min=0"])
