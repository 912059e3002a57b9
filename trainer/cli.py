"""`python -m trainer ...`: the command line of the trainer package.

Each component registers its own subcommands (``trainer/<component>/cli.py: register``, argument
parsing only) and keeps its stage body in ``trainer/<component>/stage.py: stage(cfg) -> int`` so that
`python -m trainer run RUN.yml` can run a run's stages in order (generate -> prepare -> train -> eval).
Heavy imports (torch, transformers) happen inside the commands, never at import time, so `--help` is
instant.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
import typing
from collections.abc import Sequence
from pathlib import Path

from trainer.config import ConfigError, RunConfig, load_run_config

# stage name -> module exposing `register(subparsers)` (the component's subcommands)
COMPONENTS = {
    "generate": "trainer.generate.cli",
    "prepare": "trainer.data.cli",
    "train": "trainer.dflash.cli",
    "eval": "trainer.eval.cli",
}
# stage name -> module exposing `stage(cfg) -> int`
STAGES = {
    "generate": "trainer.generate.stage",
    "prepare": "trainer.data.stage",
    "train": "trainer.dflash.stage",
    "eval": "trainer.eval.stage",
}

log = logging.getLogger("trainer")

EXIT_OK = 0
EXIT_NO = 1  # the verdict is "no": plan: does not fit; doctor, prepare, train: the data is refused
EXIT_BAD_INPUT = 2  # run file, overrides file, --set, model config, arguments, empty input
EXIT_BUG = 70  # an unexpected error: a bug in the trainer (the traceback under -v)
EXIT_INTERRUPTED = 130
EXIT_CODES = """exit codes:
  0    ok
  1    the verdict is "no" (plan: does not fit; doctor, prepare, train: the data is refused)
  2    bad input (run file, overrides file, --set, model config, arguments, no valid input)
  130  interrupted (train: after a checkpoint)
  70   an unexpected error: a bug in the trainer (-v prints the traceback)
  other: a stage that had to stop (generate: endpoints down, 1; train: the failed rank's code)
"""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2, bad input) that point to --help."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def positive_float(text: str) -> float:
    """argparse type: a number > 0 (`--gpu-memory-gb`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def add_run_config_args(p: argparse.ArgumentParser) -> None:
    """The run-config arguments every run-driven subcommand takes."""
    p.add_argument("config", help="run config, e.g. files/runs/NAME.yml")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key (dotted path, value parsed as YAML); repeatable; wins over --overrides",
    )
    p.add_argument(
        "--overrides", dest="override_files", action="append", default=[], metavar="FILE.yml",
        help="a YAML mapping merged over the run config by the same strict loader (unknown keys are "
        "errors); repeatable, later files win",
    )


def load_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config of a subcommand: run file < --overrides files < --set."""
    return load_run_config(args.config, args.overrides, args.override_files)


def _cmd_run(args: argparse.Namespace) -> int:
    return run_stages(load_from_args(args), args.force)


def run_stages(cfg: RunConfig, force: bool = False) -> int:
    """Run the stages of `cfg` in order; the exit code of the first that fails, else 0."""
    for name in cfg.stages:
        module = importlib.import_module(STAGES[name])
        # a stage may say its outputs are complete and match their inputs (trainer/data/fresh.py)
        done = None if force else getattr(module, "up_to_date", lambda _cfg: None)(cfg)
        if done:
            log.info("run %s: stage %s skipped: %s (--force redoes it)", cfg.name, name, done)
            continue
        log.info("run %s: stage %s", cfg.name, name)
        rc = module.stage(cfg)
        if rc:
            log.error("run %s: stage %s failed (exit %d)", cfg.name, name, rc)
            return rc
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    if args.base_dir is not None and not args.json:
        raise ConfigError("--base-dir: only with --json (it resolves the run_dir the JSON reports)")
    cfg = load_from_args(args)
    if args.json:
        import json

        from trainer.report import run_report

        print(json.dumps(run_report(cfg, args.config, args.base_dir), indent=1))
        return 0
    print(f"{args.config}: ok (run {cfg.name}, stages {', '.join(cfg.stages)})")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    import json

    from trainer.dflash.plan import build_plan, format_plan, plan_json, read_model_config

    cfg = load_from_args(args)
    path = args.model_config or Path(cfg.target.path) / "config.json"
    capacity = args.gpu_memory_gb or cfg.train.placement.gpu_memory_gb
    model = read_model_config(path)
    try:
        plan = build_plan(cfg, model, capacity)
    except AttributeError as e:
        raise ConfigError(f"{path}: the model config has no {getattr(e, 'name', None) or e} (plan reads a "
                          "transformers text config: num_hidden_layers, hidden_size, vocab_size ...); "
                          "pass the target's config.json with --model-config") from None
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise ConfigError(f"{path}: a value of the model config cannot be used ({e}); pass the target's "
                          "config.json with --model-config") from None
    print(json.dumps(plan_json(cfg, plan), indent=2) if args.json else format_plan(cfg, plan))
    if plan.too_big:
        worst = max(plan.too_big, key=lambda g: g.total)
        print(f"error: run {cfg.name} does not fit: GPU {worst.gpu} needs {worst.total / 1e9:.1f} GB "
              f"(target weights {worst.target_weights / 1e9:.1f}, "
              f"drafter + AdamW {worst.drafter_state / 1e9:.1f}, "
              f"activations {(worst.target_activations + worst.drafter_activations) / 1e9:.1f}, logits "
              f"{worst.logits_chunk / 1e9:.1f}) of {capacity:g} GB; {len(plan.too_big)} of {len(plan.gpus)} "
              f"GPUs over. "
              + ("Shard the drafter's state over the ranks (train.placement.strategy: fsdp), spread "
                 if cfg.train.placement.strategy != "fsdp" else "Spread ")
              + "target and drafter (train.placement.target_gpus / drafter_gpus), lower data.max_length, "
              "drafter.max_anchors or loss.chunk_blocks, or use larger cards.",
              file=sys.stderr)
        return 1
    return 0


def _cmd_tiny_target(args: argparse.Namespace) -> int:
    from trainer.data.tiny_tokenizer import build_tiny_tokenizer
    from trainer.dflash.tiny import build_tiny_target

    if (args.out / "config.json").exists() and not args.force:
        print(f"{args.out}: a model is already there (use --force to rebuild)")
        return 0
    tokenizer = build_tiny_tokenizer()
    path = build_tiny_target(args.out, tokenizer=tokenizer, seed=args.seed)
    for f in path.iterdir():  # safetensors writes 0600; a model on shared storage is read by other users
        f.chmod(0o644)
    print(f"{path}: tiny random Qwen3.5 target + tokenizer ({len(tokenizer)} tokens)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m trainer",
        description="DFlash drafter training: regenerate completions, prepare data, train, evaluate.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run every stage listed in the run config's `stages`, in order")
    add_run_config_args(p)
    p.add_argument("--force", action="store_true",
                   help="run every stage even when its outputs are complete and match their inputs")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("check", help="validate a run config and exit (--json: what the playbooks need)")
    add_run_config_args(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: stages, run dir, result paths, endpoints, staging, "
                   "secret env names, placement")
    p.add_argument("--base-dir", type=Path, default=None,
                   help="with --json: the trainer's working directory a relative run_dir is resolved against "
                   "(default: the current directory)")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser(
        "plan", help="per-GPU memory and FLOPs of the train stage from config.json alone; exit 1 if it "
        "cannot fit")
    add_run_config_args(p)
    p.add_argument("--model-config", type=Path, default=None,
                   help="the target's config.json (default: <target.path>/config.json); no weights are read")
    p.add_argument("--gpu-memory-gb", type=positive_float, default=None,
                   help="memory of one GPU in GB (default: train.placement.gpu_memory_gb, itself 80)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser(
        "make-tiny-target",
        help="save a tiny random Qwen3.5 target + tokenizer (tests and the lab; no hub download)",
    )
    p.add_argument("out", type=Path, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="rebuild even if a model is there")
    p.set_defaults(func=_cmd_tiny_target)

    for module in (*dict.fromkeys(COMPONENTS.values()), "trainer.status", "trainer.quickstart"):
        importlib.import_module(module).register(sub)
    for command in sub.choices.values():  # -v after the subcommand too; SUPPRESS keeps one given before
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="debug logging; the traceback of an unexpected error")
        command.epilog = command.epilog or EXIT_CODES
        command.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _error(message: str) -> None:
    """One line on stderr, whatever the message holds."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        _error(str(e))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:  # a path the input named: missing, unreadable, a directory ...
        where = f"{e.filename}: " if e.filename else ""
        _error(f"{where}{e.strerror or e}")
        if args.verbose:
            traceback.print_exc()
        return EXIT_BAD_INPUT
    except Exception as e:
        _error(f"unexpected {type(e).__name__}: {e}; this is a bug in the trainer"
               + ("" if args.verbose else " (rerun with -v for the traceback)"))
        if args.verbose:
            traceback.print_exc()
        return EXIT_BUG
