"""Property test of the strict loader: random mutations of the shipped run files (a key deleted,
duplicated, retyped or put out of range, in the file or through --set) are either accepted, and then
round-trip through `to_dict`, or refused by `python -m trainer check` with exit 2 and one line.
Any traceback (an exception out of `main`, or exit 70: an unexpected error) fails the test.
CI tries 300 inputs (derandomized, so the same 300 each run); FUZZ_EXAMPLES=5000 searches deeper."""
from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.cli import main
from trainer.config import load_run_config, to_dict

RUNS = sorted(Path(__file__).resolve().parents[1].glob("files/runs/*.yml"))
DATA = {p.stem: yaml.safe_load(p.read_text()) for p in RUNS}
TRIED: list[int] = [0]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2, 0.5, -0.5, 1e30, -1e30, "", "no", "on", "1e3", "010", "0x1f", "~", "nan",
                     ".inf", "auto", "train", "[1", "{a: 1}", "a: b", "x" * 300]),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def paths(data: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of a nested mapping (sections and leaves)."""
    out: list[tuple[str, ...]] = []
    if isinstance(data, dict):
        for k, v in data.items():
            out.append((*prefix, str(k)))
            out.extend(paths(v, (*prefix, str(k))))
    return out


def section_fields(path: tuple[str, ...]) -> list[str]:
    """Known keys near `path` (so that mutations also add keys the file does not set)."""
    import dataclasses
    import typing

    from trainer.config import RunConfig

    cls: Any = RunConfig
    for part in path[:-1]:
        hints = typing.get_type_hints(cls)
        cls = hints.get(part)
        if not dataclasses.is_dataclass(cls):
            return []
    return [f.name for f in dataclasses.fields(cls)]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    """(run name, YAML text of the mutated file, --set items)."""
    name = draw(st.sampled_from(sorted(DATA)))
    data = yaml.safe_load(yaml.safe_dump(DATA[name]))
    sets: list[str] = []
    duplicate = False
    for _ in range(draw(st.integers(1, 3))):
        keys = paths(data)
        path = draw(st.sampled_from(keys)) if keys else ("seed",)
        if draw(st.booleans()):  # a sibling the file may not set
            near = section_fields(path)
            if near:
                path = (*path[:-1], draw(st.sampled_from(near)))
        kind = draw(st.sampled_from(["delete", "duplicate", "retype", "range", "set"]))
        parent = data
        for part in path[:-1]:
            parent = parent.setdefault(part, {}) if isinstance(parent, dict) else {}
        if not isinstance(parent, dict):
            continue
        leaf = path[-1]
        old = parent.get(leaf)
        if kind == "delete":
            parent.pop(leaf, None)
        elif kind == "duplicate":
            duplicate = True
        elif kind == "retype":
            parent[leaf] = draw(values)
        elif kind == "range":
            if isinstance(old, bool) or not isinstance(old, int | float):
                old = 1
            parent[leaf] = draw(st.sampled_from([-old, 0, -1, old * 10**12, -(10**18), 10**18, old + 0.5]))
        else:
            value = draw(values)
            sets.append(".".join(path) + "=" + yaml.safe_dump(value, default_flow_style=True,
                                                               width=10**6).strip().removesuffix("\n..."))
    text = yaml.safe_dump(data, sort_keys=False, width=10**6)
    if duplicate:
        lines = text.splitlines()
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        text = "\n".join([*lines[: i + 1], lines[i], *lines[i + 1:]]) + "\n" if lines else text
    return name, text, sets


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(mutated())
def test_mutated_run_files_are_accepted_and_round_trip_or_refused_in_one_line(
        case: tuple[str, str, list[str]]) -> None:
    name, text, sets = case
    TRIED[0] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.yml"
        path.write_text(text)
        argv = ["check", str(path), *(a for s in sets for a in ("--set", s))]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        assert rc in (0, 2), f"exit {rc}: {err.getvalue()}"
        if rc == 2:
            lines = err.getvalue().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), err.getvalue()
            assert "Traceback" not in err.getvalue()
            return
        cfg = load_run_config(path, sets)
        again_dir = Path(tmp) / "again"
        again_dir.mkdir()
        again = again_dir / f"{name}.yml"
        again.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        assert load_run_config(again) == cfg


def test_zz_report_how_many_inputs_the_fuzz_test_tried() -> None:
    print(f"fuzz: {TRIED[0]} generated inputs")
