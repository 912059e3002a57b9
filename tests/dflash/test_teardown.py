"""How a rank leaves its process group (a real one-rank gloo group on a FileStore, in this process).

After a clean run: a barrier, then the group is destroyed, so no rank tears down while a peer still
works on the last collective. After a failure: nothing collective, because a peer may be blocked in a
collective that will never complete and would hold this rank's exit (torchrun ends the peers once this
rank exits with its error)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from trainer.dflash import device as dev
from trainer.dflash import loop


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_clean_run_meets_its_peers_at_a_barrier_then_leaves_the_group(group: None, monkeypatch) -> None:
    calls: list[str] = []
    real_barrier = dist.barrier

    def barrier(*args: Any, **kwargs: Any) -> Any:
        calls.append("barrier")
        return real_barrier(*args, **kwargs)

    monkeypatch.setattr(torch.distributed, "barrier", barrier)
    dev.destroy_distributed(ok=True)
    assert calls == ["barrier"]
    assert not dist.is_initialized()


def test_after_a_failure_no_collective_runs(group: None, monkeypatch) -> None:
    def barrier(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a collective ran after a failure")

    monkeypatch.setattr(torch.distributed, "barrier", barrier)
    dev.destroy_distributed(ok=False)
    assert dist.is_initialized()  # left for the process's exit; the fixture destroys it here


@pytest.mark.parametrize("fails", [False, True])
def test_train_tells_the_teardown_whether_the_run_ended_cleanly(fails: bool, monkeypatch) -> None:
    seen: list[bool] = []

    class Run:
        def __init__(self, cfg: Any, **kwargs: Any) -> None:
            pass

        def run(self) -> str:
            if fails:
                raise RuntimeError("a rank failed")
            return "result"

    monkeypatch.setattr(loop, "Trainer", Run)
    monkeypatch.setattr(dev, "destroy_distributed", lambda ok: seen.append(ok))
    if fails:
        with pytest.raises(RuntimeError, match="a rank failed"):
            loop.train(None)  # type: ignore[arg-type]
    else:
        assert loop.train(None) == "result"  # type: ignore[arg-type]
    assert seen == [not fails]
