"""Check logged Proxmox API requests against the real Proxmox VE API schema (pve-apidata.json, converted
from pve-docs' api-viewer/apidata.js): path and method exist, every parameter is defined, and its value has
the schema's type, enum, pattern and (for property strings) keys; required parameters are present."""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

# The schema is not kept in this repository. PVE_APIDATA names a copy; without it, a copy kept beside the
# checkout (../shared/data/pve-apidata.json) is used when present, and the schema checks skip otherwise.
_DEFAULT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "pve-apidata.json"
APIDATA = Path(os.environ.get("PVE_APIDATA") or _DEFAULT)


@cache
def load(path: Path = APIDATA) -> list[tuple[re.Pattern[str], int, dict[str, Any], set[str]]]:
    """(path regex, literal segments, methods, path variables) for every API path, most specific first."""
    out = []

    def walk(node: dict[str, Any]) -> None:
        segs = node["path"].strip("/").split("/")
        regex = "/" + "/".join("[^/]+" if s.startswith("{") else re.escape(s) for s in segs)
        literal = sum(1 for s in segs if not s.startswith("{"))
        names = {s[1:-1] for s in segs if s.startswith("{")}
        out.append((re.compile(regex), literal, node.get("info", {}), names))
        for child in node.get("children", []):
            walk(child)

    for root in json.loads(path.read_text()):
        walk(root)
    return sorted(out, key=lambda t: -t[1])


def _prop(schema: dict[str, Any], key: str) -> dict[str, Any] | None:
    props = schema.get("properties", {})
    if key in props:
        return props[key]
    m = re.fullmatch(r"([a-z]+)(\d+)", key)
    return props.get(f"{m.group(1)}[n]") if m else None


def _value_errors(key: str, spec: dict[str, Any], value: str) -> list[str]:
    errs = []
    kind = spec.get("type")
    if kind == "integer" and not re.fullmatch(r"-?\d+", value):
        errs.append(f"{key}={value!r} is not an integer")
    if kind == "boolean" and value.lower() not in {"0", "1", "true", "false", "yes", "no", "on", "off"}:
        errs.append(f"{key}={value!r} is not a boolean")
    if "enum" in spec and value not in spec["enum"]:
        errs.append(f"{key}={value!r} not in {spec['enum']}")
    if "pattern" in spec:
        try:
            ok = re.fullmatch(spec["pattern"], value) is not None
        except re.error:  # Perl-only syntax: not checkable here
            ok = True
        if not ok:
            errs.append(f"{key}={value!r} does not match {spec['pattern']}")
    fmt = spec.get("format")
    if isinstance(fmt, dict):
        default_key = next((k for k, v in fmt.items() if v.get("default_key")), None)
        for i, part in enumerate(value.split(",")):
            if "=" not in part:
                if not (i == 0 and default_key):
                    errs.append(f"{key}: '{part}' has no key and {key} has no default key")
                continue
            sub, subval = part.split("=", 1)
            if sub not in fmt:
                errs.append(f"{key}: key '{sub}' is not in the schema ({sorted(fmt)})")
            else:
                errs += _value_errors(f"{key}.{sub}", fmt[sub], subval)
    return errs


def request_errors(req: dict[str, Any]) -> list[str]:
    """Why the real API would reject this logged request (empty when it is valid)."""
    path = req["path"].removeprefix("/api2/json")
    where = f"{req['method']} {path}"
    match = next((entry for entry in load() if entry[0].fullmatch(path)), None)
    if match is None:
        return [f"{where}: no such path in the Proxmox API"]
    _regex, _literal, info, path_vars = match
    method = info.get(req["method"])
    if method is None:
        return [f"{where}: method not in the API ({sorted(info)})"]
    schema = method.get("parameters", {})
    errs = []
    for key, value in req["params"].items():
        spec = _prop(schema, key)
        if spec is None:
            errs.append(f"{where}: parameter '{key}' is not defined")
        else:
            errs += [f"{where}: {e}" for e in _value_errors(key, spec, str(value))]
    for key, spec in schema.get("properties", {}).items():
        optional = spec.get("optional") or "[n]" in key or key in path_vars
        if not optional and key not in req["params"]:
            errs.append(f"{where}: required parameter '{key}' missing")
    return errs
