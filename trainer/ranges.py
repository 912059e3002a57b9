"""Value ranges of the run config's numeric fields, checked in each section's `__post_init__`.

A range is written as in maths: ``">= 1"``, ``"> 0"``, ``"[0, 1]"``, ``"[0, 1)"``, ``"(0, 1]"``. A tuple
field is checked item by item. The message names the key by its dotted path and the value given.
"""
from __future__ import annotations

import math
from typing import Any


def _ok(value: float, spec: str) -> bool:
    spec = spec.strip()
    if spec.startswith((">=", ">", "<=", "<")):
        op = spec[:2] if spec[1] == "=" else spec[0]
        bound = float(spec[len(op):])
        return {">=": value >= bound, ">": value > bound, "<=": value <= bound, "<": value < bound}[op]
    lo_s, hi_s = spec[1:-1].split(",")
    lo, hi = float(lo_s), float(hi_s)
    above = value >= lo if spec[0] == "[" else value > lo
    below = value <= hi if spec[-1] == "]" else value < hi
    return above and below


def _describe(spec: str) -> str:
    spec = spec.strip()
    return f"be {spec}" if spec[0] in "<>" else f"be within {spec}"


def check_ranges(obj: Any, section: str, spec: dict[str, str]) -> None:
    """Raise ValueError naming `section.field` when a field of `obj` is outside its range."""
    for name, rng in spec.items():
        value = getattr(obj, name)
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if (isinstance(item, float) and not math.isfinite(item)) or not _ok(item, rng):
                key = f"{section}.{name}" if section else name
                raise ValueError(f"{key} must {_describe(rng)}, got {value!r}")
