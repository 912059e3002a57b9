"""`python -m trainer quickstart DIR`: a first run on this machine's CPU, without Ansible or SGLang.

It builds the tiny random target (`make-tiny-target`) in ``DIR/model``, writes the run file
``DIR/quickstart.yml`` (the bundled completions of trainer/quickstart_data/, 64 short arithmetic
conversations, as the generate stage would have written them), then runs its stages prepare -> train ->
eval as `python -m trainer run DIR/quickstart.yml` would, and prints τ. The target is random, so τ is
about 1: the run shows the pipeline working, not a useful drafter. Rerun it to start over.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml

COMPLETIONS = Path(__file__).with_name("quickstart_data") / "completions.jsonl"
NAME = "quickstart"
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


def quickstart(directory: Path) -> int:
    """Build the tiny target, write the run file and run its stages; 0 when τ was printed."""
    from trainer.cli import run_stages
    from trainer.config import load_run_config
    from trainer.data.tiny_tokenizer import build_tiny_tokenizer
    from trainer.dflash.tiny import build_tiny_target
    from trainer.layout import RunLayout

    t0 = time.monotonic()
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / "model"
    if not (model / "config.json").exists():
        build_tiny_target(model, tokenizer=build_tiny_tokenizer(), seed=0)
        log.info("quickstart: tiny random target + tokenizer in %s", model)
    run_file = directory / f"{NAME}.yml"
    run_file.write_text(yaml.safe_dump(run_config(directory), sort_keys=False))
    cfg = load_run_config(run_file)
    run = RunLayout.of(cfg).root
    if run.exists():  # a rerun starts over: the checkpoint of the last one would end train at once
        import shutil

        shutil.rmtree(run)
    rc = run_stages(cfg, force=True)
    if rc:
        return rc
    result = RunLayout.of(cfg).eval_result(cfg.train.max_steps)
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
