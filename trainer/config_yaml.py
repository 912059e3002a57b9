"""Reading the YAML of run files, overrides files and `--set` values, strictly.

A mapping that repeats a key is refused with both line numbers (YAML itself keeps the last one silently,
so a second `train:` section would drop the first). `--set` values are YAML scalars; when YAML turns a
word into another type (`no` -> false, `1e3` -> a string, `010` -> 8) and the key wants a string, the
error says how to quote it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the key at fault."""


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping holding the same key twice."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: construct_mapping reports it
            continue
        if first is not None:
            raise ConfigError(f"line {line}: duplicate key {key!r} (first at line {first}); "
                              "YAML would keep only the last one: merge them into one")
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def strict_load(text: str) -> Any:
    """YAML text -> data, refusing duplicate keys (ConfigError with both line numbers)."""
    return yaml.load(text, Loader=_StrictLoader)


def read_yaml(path: str | Path, what: str = "run config") -> dict[str, Any]:
    """A YAML mapping from `path` (`what` names the file's role in messages)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.strerror})") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: {what} is not UTF-8 text ({e.reason} at byte {e.start})") from e
    try:
        data = strict_load(text)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {_one_line(e)}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what} must be a mapping, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{path}: key {bad[0]!r} is not a name (quote it, or fix the indentation)")
    return data


def _one_line(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def parse_set(item: str) -> tuple[str, str, Any]:
    """`a.b=c` -> ("a.b", "c", the value as YAML reads it)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: {key!r} is not a dotted key (e.g. train.lr)")
    if raw == "":
        return key, raw, ""
    try:
        value = strict_load(raw)
    except (ConfigError, yaml.YAMLError) as e:
        why = _one_line(e) if isinstance(e, yaml.YAMLError) else str(e)
        raise ConfigError(f"--set {item}: the value is not valid YAML ({why}); quote it, e.g. "
                          f"--set '{key}=\"{raw}\"'") from e
    return key, raw, value


def yaml_hint(key: str, raw: str, value: Any, message: str) -> str:
    """A hint when the key wanted text and YAML read `raw` as another type (`no` -> False)."""
    wanted_text = "expected a string" in message or "expected a path string" in message \
        or "is not one of '" in message
    if not wanted_text or isinstance(value, str) or not isinstance(value, bool | int | float):
        return ""
    return f" (YAML reads {raw} as {value!r}; for the text, quote it: --set '{key}=\"{raw}\"')"


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `a.b=c` overrides (values parsed as YAML scalars) to raw config data."""
    for item in overrides:
        key, _raw, value = parse_set(item)
        node = data
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {key}: {'.'.join(parts[: i + 1])} is not a section")
            node = nxt
        node[parts[-1]] = value
    return data


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `over` into `base` (in place): mappings merge key by key, anything else replaces."""
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base


def dotted_keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every leaf of a nested mapping as a dotted key (a.b.c)."""
    keys: list[str] = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            keys.extend(dotted_keys(value, dotted + "."))
        else:
            keys.append(dotted)
    return keys
