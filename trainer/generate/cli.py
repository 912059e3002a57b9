"""Subcommand `generate` (and the pipeline stage of the same name, trainer/generate/stage.py).

    python -m trainer generate RUN.yml [--set generate.endpoints='[http://h:30000]'] [--overrides FILE.yml]
"""
from __future__ import annotations

import argparse

from trainer.cli_args import add_run_config_args, load_from_args
from trainer.generate.stage import stage


def _cmd(args: argparse.Namespace) -> int:
    return stage(load_from_args(args))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="Regenerate completions of the prompts on the SGLang endpoints")
    add_run_config_args(p)
    p.set_defaults(func=_cmd)
