"""Typed run config: one YAML file per run (files/runs/NAME.yml) -> frozen dataclasses.

The loader is strict: an unknown key, a missing required key or a value of the wrong type is a
`ConfigError` whose message names the key by its dotted path (``train.lr``, ``generate.endpoints[1].url``).
`--set a.b=c` overrides and `--overrides FILE.yml` files (a mapping merged over the run file) go through
the same loader, so they are validated the same way, and an error names the one that gave the value.
Precedence: run file < overrides files (in order) < `--set`. The YAML itself is read strictly too (a key
given twice is an error: trainer/config_yaml.py); numeric fields have ranges (trainer/ranges.py).

Each component owns its section (torchtitan style): the section dataclasses live next to the code that
reads them (``trainer/generate/config.py`` ...) and this module only assembles them into `RunConfig`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import posixpath
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from trainer.config_yaml import (
    ConfigError,
    apply_overrides,
    dotted_keys,
    merge,
    parse_set,
    read_yaml,
    yaml_hint,
)

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{where}: must not be null")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {tp}")
    if value is None:
        raise ConfigError(f"{where}: must not be null (expected {_type_name(tp)})")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        args = get_args(tp)
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],)
        if origin is tuple and len(args) > 1:
            if len(args) != len(value):
                raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
            pairs = enumerate(zip(args, value, strict=True))
            return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in pairs)
        item = args[0] if args else Any
        return tuple(_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        kt, vt = get_args(tp) or (Any, Any)
        return {_convert(kt, k, f"{where}.{k}"): _convert(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads 6e-4 as a string
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is not None and math.isfinite(number):
            return number
        kind = "a finite number" if number is not None else "a number"
        raise ConfigError(f"{where}: expected {kind}, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if tp is Path:
        if isinstance(value, str):
            return Path(value)
        raise ConfigError(f"{where}: expected a path string, got {value!r}")
    raise ConfigError(f"{where}: unsupported config type {tp!r}")


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass `cls` from a mapping, strictly. `where` is the dotted path for messages."""
    label = where or cls.__name__
    if not isinstance(data, Mapping):
        raise ConfigError(f"{label}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"unknown key {prefix}{unknown[0]!s}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + f"; {label} accepts: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key {key}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        # section checks name their keys (train.lr ...): no second prefix
        raise ConfigError(str(e) if not where or f"{label}." in str(e) else f"{label}: {e}") from e


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain YAML-able data (Paths as strings, tuples as lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _check_overrides(cls: type, data: Mapping[str, Any], where: str) -> None:
    """Refuse unknown keys and ill-typed leaves of an overrides mapping against section `cls`."""
    hints = get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    for key, value in data.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in fields:
            accepts = ", ".join(sorted(fields))
            raise ConfigError(f"unknown key {dotted}; {where or cls.__name__} accepts: {accepts}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{dotted}: expected a mapping, got {type(value).__name__} {value!r}")
            _check_overrides(tp, value, dotted)
        else:
            _convert(tp, value, dotted)


def read_overrides(path: str | Path) -> dict[str, Any]:
    """An overrides file: a partial run config mapping, checked key by key; errors name the file."""
    data = read_yaml(path, what="overrides file")
    try:
        _check_overrides(RunConfig, data, "")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    return data


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _blame(message: str, sources: dict[str, str], sets: dict[str, tuple[str, Any]]) -> tuple[str, str] | None:
    """The overrides file or `--set` that gave the key a message names (the last one applied wins); an
    unknown key is blamed on the source of a key below it too (`--set drafter.bogus.x=1`: the message
    names the first unknown part, drafter.bogus)."""
    unknown = re.match(r"unknown key (\S+?);", message)
    for key in reversed(list(sources)):
        leaf = key.rsplit(".", 1)
        pattern = rf"(?<![\w.]){re.escape(key)}(?![\w])"
        alt = rf"^{re.escape(leaf[0])}: {re.escape(leaf[1])}\b" if len(leaf) == 2 else None
        below = unknown is not None and key.startswith(unknown.group(1) + ".")
        if below or re.search(pattern, message) or (alt and re.search(alt, message)):
            source = sources[key]
            if source == "--set":
                raw, value = sets[key]
                return f"--set {key}={raw}: ", yaml_hint(key, raw, value, message)
            return f"{source}: ", ""
    return None


def load_run_config(path: str | Path, overrides: Sequence[str] = (),
                    override_files: Sequence[str | Path] = ()) -> RunConfig:
    """Load files/runs/NAME.yml, then each overrides file, then the `--set` overrides, into a `RunConfig`.

    Errors name where the value came from: the run file, an overrides file or the `--set` at fault.
    `name` is the run file's stem: a file without one gets it, a file with another one is refused (a
    resolved launch config, `RunLayout.launch_config`, keeps its run's name).
    """
    data = read_yaml(path)
    sources: dict[str, str] = {}
    sets: dict[str, tuple[str, Any]] = {}
    for extra in override_files:
        more = read_overrides(extra)
        sources.update(dict.fromkeys(dotted_keys(more), str(extra)))
        merge(data, more)
    for item in overrides:
        key, raw, value = parse_set(item)
        sources.pop(key, None)
        sources[key] = "--set"
        sets[key] = (raw, value)
    data = apply_overrides(data, overrides)
    data.setdefault("name", Path(path).stem)
    try:
        cfg = from_dict(RunConfig, data)
    except ConfigError as e:
        how = _blame(str(e), sources, sets)
        raise ConfigError(f"{how[0]}{e}{how[1]}" if how else f"{path}: {e}") from e
    stem = Path(path).stem
    if cfg.name != stem and Path(path).resolve() != RunLayout.of(cfg).launch_config.resolve():
        how = _blame("name", sources, sets)
        msg = f"name {cfg.name!r} is not the file's name {stem!r}: a run is named after its file ({stem}.yml)"
        raise ConfigError(f"{how[0]}{msg}{how[1]}" if how else f"{path}: {msg}")
    return cfg


# ---------------------------------------------------------------------------------------------
# Sections shared by every component. Component sections are imported from their packages.
# ---------------------------------------------------------------------------------------------
from trainer.data.config import DataConfig  # noqa: E402
from trainer.dflash.config import DrafterConfig, LossConfig, TrainConfig  # noqa: E402
from trainer.eval.config import EvalConfig  # noqa: E402
from trainer.generate.config import GenerateConfig  # noqa: E402
from trainer.layout import RunLayout  # noqa: E402
from trainer.ranges import check_ranges  # noqa: E402

Stage = Literal["generate", "prepare", "train", "eval"]


@dataclasses.dataclass(frozen=True, slots=True)
class TargetConfig:
    """The frozen target model: a local path holding a transformers checkpoint + tokenizer."""

    path: str
    name: str = ""  # served model name on the SGLang endpoints (defaults to path's basename)
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "auto"
    stage_to: str = ""  # copy the model to fast local storage (e.g. /dev/shm) before use; "" = off


@dataclasses.dataclass(frozen=True, slots=True)
class S3Config:
    """Where a run keeps its data on S3. Credentials come from the environment (AWS_*), never here."""

    bucket: str = ""
    prefix: str = ""
    endpoint_url: str = ""  # "" = AWS; set for MinIO/R2/moto
    region: str = "us-east-1"
    concurrency: int = 20

    def __post_init__(self) -> None:
        check_ranges(self, "s3", {"concurrency": ">= 1"})

    @property
    def enabled(self) -> bool:
        return bool(self.bucket)


@dataclasses.dataclass(frozen=True, slots=True)
class WandbConfig:
    project: str = ""  # "" = W&B off
    entity: str = ""
    mode: Literal["online", "offline", "disabled"] = "online"
    tags: tuple[str, ...] = ()


def staging_dir(name: str, target: TargetConfig) -> str:
    """Where run `name` stages its target: `<stage_to>/<name>`, a directory the run owns alone ("" = no
    staging). The unit empties it before and after every run, so it is never `stage_to` itself."""
    return f"{target.stage_to.rstrip('/')}/{name}" if target.stage_to else ""


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _check_staging(name: str, target: TargetConfig) -> None:
    """Refuse a staging directory that overlaps the model: the unit deletes the staged copy before and
    after every run (`rm -rf`), so an overlap would delete the source."""
    if not target.stage_to:
        return
    if not posixpath.isabs(target.stage_to):
        raise ValueError(f"target.stage_to: {target.stage_to!r} is not an absolute path "
                         "(e.g. /dev/shm/models)")
    src = posixpath.normpath(target.path)
    stage = posixpath.normpath(target.stage_to)
    run_dir = posixpath.join(stage, name)
    if _within(stage, src) or _within(run_dir, src) or _within(src, run_dir):
        raise ValueError(
            f"target.stage_to: {target.stage_to!r} overlaps target.path {target.path!r}: the run stages into "
            f"{run_dir}/ and deletes it before and after every run; stage outside the model "
            "(e.g. target.stage_to: /dev/shm/models)")


@dataclasses.dataclass(frozen=True, slots=True)
class RunConfig:
    """A whole run: what `files/runs/NAME.yml` says, unchanged from the playbook to the trainer."""

    name: str
    target: TargetConfig
    stages: tuple[Stage, ...] = ("train",)
    run_dir: str = "runs/{name}"  # local working dir of the run; {name} is substituted
    seed: int = 0
    s3: S3Config = dataclasses.field(default_factory=S3Config)
    wandb: WandbConfig = dataclasses.field(default_factory=WandbConfig)
    generate: GenerateConfig = dataclasses.field(default_factory=GenerateConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    drafter: DrafterConfig = dataclasses.field(default_factory=DrafterConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"name: {self.name!r} is not a run name (letters, digits, '.', '_', '-'; "
                             "it names the run's file, directory and unit)")
        if not self.stages:
            raise ValueError("stages: empty; list some of generate, prepare, train, eval")
        order = list(typing.get_args(Stage))
        ranks = [order.index(s) for s in self.stages]
        if ranks != sorted(set(ranks)):
            raise ValueError(f"stages: {list(self.stages)} is not in pipeline order without repeats "
                             f"({', '.join(order)})")
        check_ranges(self, "", {"seed": ">= 0"})
        if self.train.upload_checkpoints and not self.s3.enabled:
            raise ValueError("train.upload_checkpoints is set but s3.bucket is empty")
        _check_staging(self.name, self.target)
