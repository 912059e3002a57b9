"""What the playbooks need to know about a run, from the trainer that owns it (`check --json`).

The Ansible role asks instead of restating the trainer's defaults in Jinja: the stages, the resolved run
directory and result paths (`trainer.layout`), whether a generate stage still needs endpoints, the
target's staging source and destination, the names of the secret environment variables the run reads
and the process placement. Values only, no secrets: the names of the variables, never their contents.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import staging_dir
from trainer.layout import RunLayout

if TYPE_CHECKING:
    from trainer.config import RunConfig

# boto3 reads these (trainer/s3.py); the session token only for temporary credentials
S3_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
WANDB_SECRET_ENV = ("WANDB_API_KEY",)


def uses_s3(cfg: RunConfig) -> bool:
    """Whether any stage of the run talks to S3 (the run's bucket, or an s3:// input)."""
    stages = set(cfg.stages)
    inputs = [cfg.generate.prompts if "generate" in stages else "",
              cfg.data.completions if "prepare" in stages else ""]
    return cfg.s3.enabled or any(str(p).startswith("s3://") for p in inputs)


def secret_env(cfg: RunConfig) -> dict[str, list[str]]:
    """The secret environment variables the run reads, by what reads them (empty lists when unused)."""
    generate = "generate" in cfg.stages and bool(cfg.generate.api_key_env)
    wandb = bool(cfg.wandb.project) and cfg.wandb.mode == "online" and "train" in cfg.stages
    return {
        "s3": list(S3_SECRET_ENV) if uses_s3(cfg) else [],
        "wandb": list(WANDB_SECRET_ENV) if wandb else [],
        "generate": [cfg.generate.api_key_env] if generate else [],
    }


def staging(cfg: RunConfig) -> dict[str, str]:
    """`target.stage_to`: copy `target.path` to `<stage_to>/<run>/<basename>` before use ("" = no
    staging). `<stage_to>/<run>` is the run's own directory (`staging_dir`): the role creates it for the
    run's user, and the unit deletes only the copy inside it."""
    src = cfg.target.path.rstrip("/") or cfg.target.path
    run_dir = staging_dir(cfg.name, cfg.target)
    return {
        "path": cfg.target.path,
        "stage_to": cfg.target.stage_to,
        "source": src if run_dir else "",
        "destination": f"{run_dir}/{Path(src).name}" if run_dir else "",
    }


def outputs(cfg: RunConfig) -> dict[str, str]:
    """Where the run reports to, for the playbooks' launch message ("" = off)."""
    wandb = cfg.wandb.project and cfg.wandb.mode != "disabled" and "train" in cfg.stages
    return {
        "wandb": "/".join(p for p in (cfg.wandb.entity, cfg.wandb.project) if p) if wandb else "",
        "s3": f"s3://{cfg.s3.bucket}/{cfg.s3.prefix}" if cfg.s3.enabled else "",
    }


def run_report(cfg: RunConfig, config_path: str | Path, base: str | Path | None = None) -> dict[str, Any]:
    """The `check --json` object. `base`: the trainer's working directory for a relative `run_dir`
    (default: this process's working directory)."""
    layout = RunLayout.of(cfg, Path(base) if base is not None else Path.cwd())
    p = cfg.train.placement
    generates = "generate" in cfg.stages
    secrets = secret_env(cfg)
    return {
        "name": cfg.name,
        "config": str(config_path),
        "stages": list(cfg.stages),
        "run_dir": str(layout.root),
        "paths": layout.to_json(),
        "generate": {
            "stage": generates,
            "endpoints": list(cfg.generate.endpoints),
            "needs_endpoints": generates and not cfg.generate.endpoints,
            "api_key_env": cfg.generate.api_key_env,
        },
        "target": staging(cfg),
        "secret_env": secrets,
        "secret_env_names": sorted({n for names in secrets.values() for n in names}),
        "outputs": outputs(cfg),
        "placement": {
            "nnodes": p.nnodes,
            "nproc_per_node": p.nproc_per_node,
            "node_rank": p.node_rank,
            "world_size": p.world_size,
            "launches_torchrun": p.launches_torchrun,
            "rdzv_endpoint": p.rdzv_endpoint,
        },
    }
