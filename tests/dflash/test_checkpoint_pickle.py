"""Checkpoints load without unpickling code: a `.pt` file holding a pickled object (planted by whoever can
write the bucket, or left by an older release) is refused with a message naming the file, and the object's
code never runs. Evaluation reads only the safetensors weights and meta.json."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trainer.dflash.checkpoint import CheckpointError, load_state, load_weights, load_weights_and_optimizer


class Planted:
    """What an attacker pickles: unpickling it calls Path.touch(marker), a harmless stand-in for os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def _step_dir(tmp_path: Path, state: object, optimizer: object) -> Path:
    d = tmp_path / "step-0000010"
    d.mkdir()
    save_file({"layers.0.weight": torch.zeros(2, 2)}, str(d / "drafter.safetensors"))
    (d / "meta.json").write_text(json.dumps({"step": 10, "arch": {}}))
    torch.save(state, d / "state.pt")
    torch.save(optimizer, d / "optimizer.pt")
    return d


def test_a_planted_object_in_state_pt_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    d = _step_dir(tmp_path, {"step": 10, "rng": Planted(marker)}, {"state": {}, "param_groups": []})
    pickle.loads(pickle.dumps(Planted(marker)))  # the payload is real: plain unpickling runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(CheckpointError, match=r"state\.pt: refused: it holds more than tensors"):
        load_state(d)
    assert not marker.exists()


def test_a_planted_object_in_optimizer_pt_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    d = _step_dir(tmp_path, {"step": 10}, {"state": {0: {"exp_avg": Planted(marker)}}, "param_groups": []})
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: refused"):
        load_weights_and_optimizer(d)
    assert not marker.exists()


def test_evaluation_reads_only_the_weights(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    d = _step_dir(tmp_path, Planted(marker), Planted(marker))
    weights, meta = load_weights(d)
    assert list(weights) == ["layers.0.weight"] and meta["step"] == 10
    assert not marker.exists()


def test_plain_state_loads(tmp_path: Path) -> None:
    d = _step_dir(tmp_path, {"step": 10, "rng": torch.get_rng_state(), "epoch": 1}, {"state": {}})
    state, meta = load_state(d)
    assert state["step"] == 10 and torch.equal(state["rng"], torch.get_rng_state()) and meta["step"] == 10
