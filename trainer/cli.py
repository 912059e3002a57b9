"""`python -m trainer ...`: the command line of the trainer package (the dispatcher).

Each component registers its own subcommands (``trainer/<component>/cli.py: register``, argument
parsing only, with the shared helpers of trainer/cli_args.py) and keeps its stage body in
``trainer/<component>/stage.py: stage(cfg) -> int`` so that `python -m trainer run RUN.yml` can run a
run's stages in order (generate -> prepare -> train -> eval, trainer/stages.py). Nothing imports this
module but ``trainer/__main__.py``. Heavy imports (torch, transformers) happen inside the commands, never
at import time, so `--help` is instant.

The commands that write a run (run, train, prepare, generate) hold its one-writer lock
(trainer/runlock.py) from here, so a second one on the same run is refused whichever it is.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from trainer.cli_args import (
    EXIT_BAD_INPUT,
    EXIT_BUG,
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_NO,
    Parser,
    add_run_config_args,
    load_from_args,
    positive_float,
)
from trainer.config import ConfigError
from trainer.stages import STAGES, run_stages

# stage name -> module exposing `register(subparsers)` (the component's subcommands)
COMPONENTS = {
    "generate": "trainer.generate.cli",
    "prepare": "trainer.data.cli",
    "train": "trainer.dflash.cli",
    "eval": "trainer.eval.cli",
}
WRITERS = ("run", "train", "prepare", "generate")  # commands that hold the run's lock
__all__ = ["COMPONENTS", "EXIT_BAD_INPUT", "EXIT_BUG", "EXIT_NO", "STAGES", "build_parser", "main"]

log = logging.getLogger("trainer")


def _cmd_run(args: argparse.Namespace) -> int:
    return run_stages(load_from_args(args), args.force)


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
    from trainer.dflash.plan import run_plan

    return run_plan(load_from_args(args), args.model_config, args.gpu_memory_gb, args.json)


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


def _dispatch(args: argparse.Namespace) -> int:
    """The command, under the run's lock when it writes the run (not in a torchrun rank: the launcher
    that started the ranks holds it)."""
    if args.command not in WRITERS or "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
        return int(args.func(args) or 0)
    from trainer.layout import RunLayout
    from trainer.runlock import hold

    cfg = load_from_args(args)
    p = cfg.train.placement
    with hold(RunLayout.of(cfg).node_lock(p.node_rank if p.nnodes > 1 else 0), f"run {cfg.name}"):
        return int(args.func(args) or 0)


def _quiet_broken_pipe() -> int:
    """The reader went away (`status | head -1`): nothing more to say, and Python's flush at exit must
    not complain either (the documented way: point stdout at devnull)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from trainer.runlock import RunBusy

    try:
        rc = _dispatch(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below, not at exit
        return rc
    except ConfigError as e:
        _error(str(e))
        return EXIT_BAD_INPUT
    except RunBusy as e:
        _error(str(e))
        return EXIT_NO
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except ModuleNotFoundError as e:  # the environment lacks a package the command needs
        if (e.name or "trainer").partition(".")[0] == "trainer":  # a module of the trainer itself: a bug
            return _bug(e, args.verbose)
        _error(f"this command needs the Python package {e.name!r}, which is not installed in "
               f"{sys.prefix}; install the trainer with its dependencies (pip install -e . in the "
               "checkout) and retry")
        if args.verbose:
            traceback.print_exc()
        return EXIT_BAD_INPUT
    except OSError as e:  # a path the input named: missing, unreadable, a directory ...
        if e.errno == errno.EPIPE:
            return _quiet_broken_pipe()
        where = f"{e.filename}: " if e.filename else ""
        _error(f"{where}{e.strerror or e}")
        if args.verbose:
            traceback.print_exc()
        return EXIT_BAD_INPUT
    except Exception as e:
        return _bug(e, args.verbose)


def _bug(e: BaseException, verbose: bool) -> int:
    _error(f"unexpected {type(e).__name__}: {e}; this is a bug in the trainer"
           + ("" if verbose else " (rerun with -v for the traceback)"))
    if verbose:
        traceback.print_exc()
    return EXIT_BUG
