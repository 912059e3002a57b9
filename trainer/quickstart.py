"""`python -m trainer quickstart DIR`: a first run on this machine's CPU, without Ansible or SGLang.

It builds the tiny random target (`make-tiny-target`) in ``DIR/model``, writes the run file
``DIR/quickstart.yml`` (the bundled completions of trainer/quickstart_data/, 64 short arithmetic
conversations, as the generate stage would have written them), then runs its stages prepare -> train ->
eval as `python -m trainer run DIR/quickstart.yml` would, and prints τ. The target is random, so τ is
about 1: the run shows the pipeline working, not a useful drafter.

DIR is new, empty, or one an earlier quickstart made (it leaves ``DIR/.trainer-quickstart``); any other
directory is refused, whatever it holds. A rerun starts the training over as `train --fresh` does: the
earlier run's checkpoints, metrics and results move to ``DIR/run/set-aside/``, nothing is deleted. The
model is built in a temporary directory and renamed into place, so a quickstart stopped half way never
leaves a half-built ``DIR/model`` behind to be reused.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import yaml

from trainer.config import ConfigError
from trainer.runlock import hold

COMPLETIONS = Path(__file__).with_name("quickstart_data") / "completions.jsonl"
NAME = "quickstart"
MARKER = ".trainer-quickstart"  # DIR was made by quickstart; also the lock two quickstarts on DIR share
MODEL_DONE = ".quickstart-model-complete"  # written last into the model before it is renamed into place
log = logging.getLogger("trainer")


def run_config(directory: Path) -> dict[str, Any]:
    """The quickstart's run file: one CPU process, a 2-layer drafter, a few dozen steps."""
    return {
        "name": NAME,
        "stages": ["prepare", "train", "eval"],
        "run_dir": str(directory / "run"),
        "target": {"path": str(directory / "model"), "name": "tiny", "dtype": "float32"},
        "data": {"completions": str(COMPLETIONS), "max_length": 256, "num_workers": 1,
                 "heldout_share": 0.2, "doctor": {"max_duplicate_share": 0.5}},
        "drafter": {"num_layers": 2, "block_size": 8, "mask_token_id": 479, "max_anchors": 16,
                    "sliding_window": 128},
        "train": {"lr": 3.0e-3, "epochs": 1, "max_steps": 24, "batch_size": 4, "device": "cpu",
                  "dtype": "float32", "log_every": 8, "save_every": 0, "keep_last": 1, "progress": False,
                  "placement": {"strategy": "none"}},
        "eval": {"max_samples": 16, "max_anchors": 8},
    }


def _build_model(model: Path) -> None:
    """The tiny target in `model`, built beside it and renamed into place; an incomplete one (from a run
    stopped half way) is rebuilt, never reused."""
    import shutil

    from trainer.data.tiny_tokenizer import build_tiny_tokenizer
    from trainer.dflash.tiny import build_tiny_target

    if (model / MODEL_DONE).is_file():
        return
    tmp = model.with_name(f".{model.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tiny_target(tmp, tokenizer=build_tiny_tokenizer(), seed=0)
    (tmp / MODEL_DONE).write_text("")
    if model.exists():  # incomplete: made by an earlier quickstart in this directory (it has the marker)
        shutil.rmtree(model)
    os.replace(tmp, model)
    log.info("quickstart: tiny random target + tokenizer in %s", model)


def refuse_foreign(directory: Path) -> None:
    """A directory quickstart did not make and that holds anything: refused (it writes model/, run/ and
    quickstart.yml there and may start them over)."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"quickstart {directory}: not a directory")
    if directory.is_dir() and not (directory / MARKER).exists() and any(directory.iterdir()):
        raise ConfigError(f"quickstart {directory}: the directory is not empty and quickstart did not "
                          f"make it (no {MARKER}); give a new or empty directory")


def quickstart(directory: Path) -> int:
    """Build the tiny target, write the run file and run its stages; 0 when τ was printed."""
    directory = directory.resolve()
    refuse_foreign(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with hold(directory / MARKER, f"quickstart {directory}"):
        return _quickstart(directory)


def _quickstart(directory: Path) -> int:
    from trainer.config import load_run_config
    from trainer.dflash.stage import set_aside
    from trainer.layout import RunLayout
    from trainer.stages import run_stages

    t0 = time.monotonic()
    _build_model(directory / "model")
    run_file = directory / f"{NAME}.yml"
    run_file.write_text(yaml.safe_dump(run_config(directory), sort_keys=False))
    cfg = load_run_config(run_file)
    layout = RunLayout.of(cfg)
    with hold(layout.lock, f"run {cfg.name}"):
        set_aside(cfg)  # a rerun starts over: the last run's checkpoint would end train at once
        rc = run_stages(cfg, force=True)
    if rc:
        return rc
    result = layout.eval_result(cfg.train.max_steps)
    tau = json.loads(result.read_text())["tau_mean"]
    print(f"quickstart: tau {tau:.3f} (a random target: about 1) after prepare -> train -> eval in "
          f"{time.monotonic() - t0:.0f}s; run file {run_file} (python -m trainer run {run_file} reruns it), "
          f"result {result}")
    return 0


def _cmd(args: argparse.Namespace) -> int:
    return quickstart(args.dir)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="a first run on the CPU in about a minute: tiny target, bundled "
                       "completions, prepare -> train -> eval, prints tau")
    p.add_argument("dir", type=Path, help="working directory (the model, the run file and the run go here)")
    p.set_defaults(func=_cmd)
