"""No step but a log step reads a value back from the device (on GPU each read waits for the GPU's queue).

The run is on CPU, where a read costs nothing, so every read is counted instead: item / float / int / bool
(aten._local_scalar_dense), nonzero, masked_select and boolean indexing (their result is sized on the host),
tolist, numpy and cpu. Host-side work is left out of the count: collate and the blocks (worked out on the
host before they are copied over) and the optimizer step (AdamW keeps its step counter on the host on CPU;
on GPU the fused AdamW keeps it on the device). The frozen target's forward is left out too: transformers'
Qwen3.5 reads one value per forward there (masking_utils.find_packed_sequence_indices, a check for packed
sequences), a sync this trainer does not remove. What only a GPU shows: torch.cuda.set_sync_debug_mode
("error") around a non-log step, which also catches the copies to the host a CPU run cannot tell apart.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.config import load_run_config
from trainer.dflash import loop, step
from trainer.dflash.stop import StopVote
from trainer.dflash.target import TargetModel

_READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default"}


class _Reads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.paused, self.step, self.seen = 0, 0, defaultdict(list)

    def note(self, what: str) -> None:
        if not self.paused:
            self.seen[self.step].append(what)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        indices = args[1] if len(args) > 1 and isinstance(args[1], list) else []
        bool_index = name.startswith("aten.index") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
        if name in _READS or bool_index:
            self.note(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Reads]:
    mode = _Reads()

    @contextlib.contextmanager
    def host() -> Iterator[None]:
        mode.paused += 1
        try:
            yield
        finally:
            mode.paused -= 1

    def on_host(fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            with host():
                return fn(*a, **k)
        return run

    def noting(name: str) -> Any:
        orig = getattr(torch.Tensor, name)

        def noted(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            mode.note(name)
            return orig(self, *a, **k)
        return noted

    for name in ("tolist", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, noting(name))
    monkeypatch.setattr(loop, "collate", on_host(loop.collate))
    monkeypatch.setattr(step, "host_blocks", on_host(step.host_blocks))
    monkeypatch.setattr(TargetModel, "features", on_host(TargetModel.features))
    train_step = loop.Trainer._train_step

    def counted_step(self: loop.Trainer, it: Any) -> Any:
        mode.step = self.step + 1  # what follows belongs to this step, up to the next one's start
        if not hasattr(self.opt, "_on_host"):
            self.opt.step = on_host(self.opt.step)  # type: ignore[method-assign]
            self.opt._on_host = True  # type: ignore[attr-defined]
        return train_step(self, it)

    monkeypatch.setattr(loop.Trainer, "_train_step", counted_step)
    with mode:
        yield mode


def test_only_log_steps_read_back_from_the_device(make_run, reads: _Reads) -> None:
    cfg = load_run_config(make_run(train={"max_steps": 5, "log_every": 3, "grad_accum": 2}))
    result = loop.train(cfg)
    assert result.step == 5 and len(result.losses) == 5 and result.export is not None
    assert reads.seen[1] == [] and reads.seen[2] == [] and reads.seen[4] == [], dict(reads.seen)
    assert reads.seen[3] and reads.seen[5]  # the log steps read the window back (and the counter sees it)


def test_the_ranks_stop_one_step_after_the_signal() -> None:
    vote = StopVote(torch.device("cpu"), distributed=True)  # no process group: the sum of one rank
    assert [vote(f) for f in (False, True, False, False)] == [False, False, True, False]
    assert [StopVote(torch.device("cpu"), distributed=False)(f) for f in (False, True)] == [False, True]
