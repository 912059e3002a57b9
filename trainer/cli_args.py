"""The argument helpers every subcommand shares: the parser class, the run-config arguments, the exit codes.

The dispatcher (trainer/cli.py) imports the components' `register` functions; the components import
these helpers from here, never from the dispatcher, so no import runs back up into it.
"""
from __future__ import annotations

import argparse
import typing

from trainer.config import RunConfig, load_run_config

EXIT_NO = 1  # the verdict is "no": plan: does not fit; doctor, prepare, train: the data is refused
EXIT_BAD_INPUT = 2  # run file, overrides file, --set, model config, arguments, empty input
EXIT_BUG = 70  # an unexpected error: a bug in the trainer (the traceback under -v)
EXIT_INTERRUPTED = 130
EXIT_CODES = """exit codes:
  0    ok
  1    the verdict is "no" (plan: does not fit; doctor, prepare, train: the data is refused; the run is
       in use by another command)
  2    bad input (run file, overrides file, --set, model config, arguments, no valid input, an
       environment that cannot run the run: no CUDA device, a missing package)
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
