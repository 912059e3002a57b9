"""Fixtures for the DFlash trainer tests: a tiny random Qwen3.5 target on disk, prepared shards and
run configs. Everything is built here; nothing is downloaded."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from dflash_factory import random_rows, write_shards

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "tests/fixtures/runs"  # the tests' own runs (overfit.yml)


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.dflash.tiny import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("tiny") / "target", vocab_size=512)


@pytest.fixture
def make_run(tmp_path: Path, tiny_target_dir: Path) -> Callable[..., Path]:
    """Write a run config (tests/fixtures/runs/NAME.yml or a dict) into tmp, with target, run_dir and
    shards set."""

    def make(base: str | dict[str, Any] = "overfit", *,
             rows: Sequence[tuple[list[int], list[int]]] | None = None, doctor_passed: bool = True,
             **sections: dict[str, Any]) -> Path:
        data = (yaml.safe_load((RUNS / f"{base}.yml").read_text()) if isinstance(base, str)
                else dict(base))
        data["target"] = {**data.get("target", {}), "path": str(tiny_target_dir)}
        data["run_dir"] = str(tmp_path / "run")
        for key, val in sections.items():
            data[key] = {**data.get(key, {}), **val}
        write_shards(tmp_path / "run" / "shards", rows if rows is not None else random_rows(4, 48),
                     doctor_passed=doctor_passed)
        path = tmp_path / f"{data.get('name', 'run')}.yml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return make
