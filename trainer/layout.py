"""Where a run keeps its files: the one module that knows the run directory's layout.

    <run_dir>/
        run.lock                      one writer at a time: the flock of run, train, prepare, generate
                                      (trainer/runlock.py); it names the holder's pid, host and command;
                                      run.node-R.lock for node R > 0 of a multi-node run
        <generate.output>/            shards of regenerated completions, manifest.json (progress)
            _state/                   spool: lock, open/ shards, manifest/ sidecars, uploaded, rejects.ndjson,
                                      skipped.ndjson, progress.json, summary.json
        completions/                  completions fetched from S3 for prepare (data.completions s3://)
        <data.shards>/                Arrow shards + manifest.json with the doctor's verdict
        <data.heldout_shards>/        the conversations held out of training (eval scores them)
        launch/config.yml             the resolved config every torchrun rank loads
        checkpoints/step-NNNNNNN/     numbered checkpoints, `latest` pointer (trainer/dflash/checkpoint.py)
        export/                       the drafter exported for SGLang
        metrics.jsonl                 training metrics (and wandb/ when W&B is on)
        eval/step-NNNNNNN.json        offline acceptance length of a checkpoint
        set-aside/train-<UTC time>/   a train run's outputs moved aside by `train --fresh` (never deleted)

Relative paths in the config (`run_dir`, `data.shards`, `eval.shards`) are relative to the trainer's
working directory (`run_dir`) and to the run directory (the others); `base` resolves `run_dir` for a
caller elsewhere (the controller asking for the node's paths).

Generate's output dir and a shards dir have the same shape wherever they are (a run dir, a test's tmp
dir, an S3 prefix): the names inside them are the constants and helpers below, which RunLayout and the
modules that write and read those dirs (trainer.generate.store and .remote, trainer.data) share.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.config import RunConfig

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"  # under the run dir; a run dir given as a checkpoint resolves through it
EVAL_PATTERN = "step-*.json"
CHECKPOINT_PATTERN = "step-*"
LOCK_FILE = "run.lock"

MANIFEST_FILE = "manifest.json"  # in generate's output dir and in a shards dir: what the dir holds when whole
STATE_DIR = "_state"  # generate's spool in its output dir (`_`-prefixed: readers of completions skip it)
SIDECARS_DIR = f"{STATE_DIR}/manifest"  # a sidecar per sealed shard, relative to the output dir (also on S3)
OPEN_DIR = f"{STATE_DIR}/open"  # the shards being written, relative to the output dir
REJECTS_FILE = f"{STATE_DIR}/rejects.ndjson"  # rejected prompts, relative to the output dir (also on S3)


def manifest_of(directory: Path) -> Path:
    """The manifest.json of generate's output dir or of a shards dir."""
    return directory / MANIFEST_FILE


def generate_state_dir(output: Path) -> Path:
    """Generate's spool under its output dir: lock, open shards, sidecars, progress, summary."""
    return output / STATE_DIR


def step_name(step: int) -> str:
    """The name of a step's checkpoint dir and of its eval result (without .json): step-0000100."""
    return f"step-{step:07d}"


_STEP_DIR = re.compile(r"^step-(\d{7,})$")


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """The step dirs under a checkpoints root, oldest first (complete or not)."""
    if not ckpt_root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_root.iterdir()
             if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


FILES_LIST = "files.json"  # in a step dir, written last: {"files": {name: size in bytes}} of the others


def files_problem(listed: Mapping[str, int], sizes: Mapping[str, int]) -> str | None:
    """What keeps a checkpoint whose files list is `listed` from being complete, given the files there
    (`sizes`: name -> size): the first listed file missing or of another size; None when all are there."""
    for name, size in sorted(listed.items()):
        if name not in sizes:
            return f"{name} is missing"
        if sizes[name] != size:
            return f"{name} has {sizes[name]} bytes, not {size}"
    return None


def read_files_list(text: str) -> dict[str, int]:
    """The {name: size} of a files.json text; ValueError when it is not one."""
    files = json.loads(text).get("files") if text.strip().startswith("{") else None
    if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in files.items()):
        raise ValueError(f"{FILES_LIST} is not a {{\"files\": {{name: size}}}} object")
    return files


def checkpoint_problem(step_dir: Path) -> str | None:
    """Why `step_dir` is not a complete checkpoint, naming the file at fault; None when it is complete.

    Complete: meta.json is there and every file files.json lists is there with its size (files.json is
    written last, so a copy cut short, a file deleted or truncated afterwards is seen). A step dir with
    meta.json and no files.json was written before the list existed: it is accepted as before, on
    meta.json alone."""
    if not (step_dir / "meta.json").is_file():
        return "meta.json is missing"
    listing = step_dir / FILES_LIST
    if not listing.is_file():
        return None  # an older checkpoint (no files list): complete when meta.json is there, as it was then
    try:
        listed = read_files_list(listing.read_text())
    except (OSError, ValueError) as e:
        return f"{FILES_LIST} cannot be read ({e})"
    sizes = {name: (step_dir / name).stat().st_size for name in listed if (step_dir / name).is_file()}
    return files_problem(listed, sizes)


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The dir named by `latest` if it is complete (checkpoint_problem), else the newest complete step dir,
    else None; each incomplete one passed over is logged with the file at fault. Torch-free, so `status`
    can read it beside a live run."""
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        cand = ckpt_root / pointer.read_text().strip()
        problem = checkpoint_problem(cand)
        if problem is None:
            return cand
        log.warning("%s names %s, which is incomplete (%s); falling back to the newest complete step dir",
                    pointer, cand, problem)
    for step_dir in reversed(list_checkpoints(ckpt_root)):
        problem = checkpoint_problem(step_dir)
        if problem is None:
            return step_dir
        log.warning("checkpoint %s is incomplete (%s): not resumed from", step_dir, problem)
    return None


def _under(root: Path, path: str | Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else root / p


@dataclasses.dataclass(frozen=True, slots=True)
class RunLayout:
    """The paths of one run, derived from its config once (`RunLayout.of(cfg)`)."""

    root: Path  # the run directory
    shards: Path  # prepared Arrow shards (data.shards)
    heldout_shards: Path  # conversations held out of training (data.heldout_shards)
    eval_shards: Path  # the shards eval scores (eval.shards, else the held-out shards, else data.shards)
    eval_split: str  # which those are: "eval.shards", "heldout" or "training"
    generate_output: Path  # generate's output dir (generate.output)
    completions: str  # prepare's input, a path or s3:// URL (data.completions, else generate's)

    @classmethod
    def of(cls, cfg: RunConfig, base: str | Path | None = None) -> RunLayout:
        root = Path(cfg.run_dir.format(name=cfg.name))
        if base is not None:
            root = _under(Path(base), root)
        heldout = _under(root, cfg.data.heldout_shards)
        if cfg.eval.shards:
            eval_shards, split = _under(root, cfg.eval.shards), "eval.shards"
        elif cfg.data.heldout_share > 0:
            eval_shards, split = heldout, "heldout"
        else:
            eval_shards, split = _under(root, cfg.data.shards), "training"
        return cls(
            root=root,
            shards=_under(root, cfg.data.shards),
            heldout_shards=heldout,
            eval_shards=eval_shards,
            eval_split=split,
            generate_output=root / cfg.generate.output,
            completions=cfg.data.completions or str(root / cfg.generate.output),
        )

    @property
    def lock(self) -> Path:
        """The run's one-writer lock (trainer/runlock.py)."""
        return self.root / LOCK_FILE

    def node_lock(self, node_rank: int) -> Path:
        """The lock of one node of a multi-node run: each node's launcher writes the same run dir (shared
        storage), so each holds its own; a second command for the same node is still refused."""
        return self.lock if node_rank == 0 else self.root / f"run.node-{node_rank}.lock"

    # -- generate ------------------------------------------------------------------------------------
    @property
    def generate_state(self) -> Path:
        return generate_state_dir(self.generate_output)

    @property
    def generate_manifest(self) -> Path:
        """The progress manifest (complete, shards, counts), mirrored to S3."""
        return manifest_of(self.generate_output)

    @property
    def generate_sidecars(self) -> Path:
        """One JSON sidecar per sealed shard (sha256, bytes, records, ids)."""
        return self.generate_output / SIDECARS_DIR

    @property
    def generate_open(self) -> Path:
        """The shards being written, one flushed line per completion."""
        return self.generate_output / OPEN_DIR

    @property
    def generate_progress(self) -> Path:
        """Done/total, rates and ETA of the generate run in progress, rewritten at each progress tick."""
        return self.generate_state / "progress.json"

    @property
    def generate_summary(self) -> Path:
        return self.generate_state / "summary.json"

    @property
    def generate_rejects(self) -> Path:
        return self.generate_output / REJECTS_FILE

    @property
    def generate_skipped(self) -> Path:
        """Conversations not sent because the token budget left too little (not rejects of the input)."""
        return self.generate_state / "skipped.ndjson"

    @property
    def prompts_cache(self) -> Path:
        """Where an s3:// prompts file is downloaded once."""
        return self.generate_state / "prompts"

    # -- prepare -------------------------------------------------------------------------------------
    @property
    def shards_manifest(self) -> Path:
        """The prepared shards' manifest.json (counts, files, the doctor's verdict), written last."""
        return manifest_of(self.shards)

    @property
    def fetched_completions(self) -> Path:
        """Where prepare downloads completions that live on S3."""
        return self.root / "completions"

    # -- train ---------------------------------------------------------------------------------------
    @property
    def compile_cache(self) -> Path:
        """torch.compile's inductor and Triton caches: under the run, so a relaunch (the unit's PrivateTmp
        is a new /tmp each time) reuses the kernels the last launch compiled."""
        return self.root / "cache"

    @property
    def launch_config(self) -> Path:
        return self.root / "launch" / "config.yml"

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def export(self) -> Path:
        return self.root / "export"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def train_outputs(self) -> tuple[Path, ...]:
        """What a train run writes, all of which `train --fresh` moves aside together (a later step's
        metrics beside an earlier run's checkpoints would tell two runs as one)."""
        return (self.checkpoints, self.metrics, self.root / "wandb", self.export, self.eval_dir,
                self.launch_config.parent)

    def set_aside(self, stamp: str) -> Path:
        """Where `train --fresh` moves the train outputs of an earlier run (`stamp`: a UTC time)."""
        return self.root / "set-aside" / f"train-{stamp}"

    # -- eval ----------------------------------------------------------------------------------------
    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    def eval_result(self, step: int) -> Path:
        return self.eval_dir / f"{step_name(step)}.json"

    def to_json(self) -> dict[str, str]:
        """Every path as a string (`python -m trainer check --json`)."""
        return {
            "run_dir": str(self.root),
            "generate_output": str(self.generate_output),
            "generate_manifest": str(self.generate_manifest),
            "generate_progress": str(self.generate_progress),
            "generate_summary": str(self.generate_summary),
            "generate_rejects": str(self.generate_rejects),
            "completions": self.completions,
            "shards": str(self.shards),
            "heldout_shards": str(self.heldout_shards),
            "eval_shards": str(self.eval_shards),
            "launch_config": str(self.launch_config),
            "checkpoints": str(self.checkpoints),
            "checkpoint_pattern": CHECKPOINT_PATTERN,
            "export": str(self.export),
            "metrics": str(self.metrics),
            "eval_dir": str(self.eval_dir),
            "eval_pattern": EVAL_PATTERN,
        }
