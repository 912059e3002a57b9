"""README.md is where a newcomer starts: its first screen (60 lines) holds the layout map, and every path
the map lists exists."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FIRST_SCREEN = 60


def layout_entries(text: str) -> tuple[int, list[str]]:
    """(line of the `## Layout` heading, the paths of its map): each map line is `PATH[, PATH]  what`,
    indented; a line indented further continues the one above."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"##\s+Layout\b.*", line))
    paths: list[str] = []
    indent = None
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if not line.strip() or line.strip().startswith("```"):
            continue
        this = len(line) - len(line.lstrip())
        if indent is None:
            indent = this
        if this > indent:  # a continuation of the entry above
            continue
        if this < indent:
            break
        first = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        paths += [p.strip() for p in first.split(",")]
    return start + 1, paths


def test_the_layout_map_is_on_the_first_screen() -> None:
    line, paths = layout_entries(README.read_text())
    assert line <= FIRST_SCREEN, f"README.md:{line}: the layout map starts after line {FIRST_SCREEN}"
    assert len(paths) >= 10 and "trainer/" in paths and "roles/" in paths


def test_every_path_of_the_layout_map_exists() -> None:
    _, paths = layout_entries(README.read_text())
    missing = [p for p in paths if not (REPO / p).exists() or (p.endswith("/") and not (REPO / p).is_dir())]
    assert not missing, f"README.md's layout map lists paths that do not exist: {missing}"


def test_the_first_screen_has_the_commands_ci_runs() -> None:
    """The two commands for a fresh machine, and the production entry points, are on the first screen;
    .ci/run runs the same bin/test."""
    first = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    for command in ("bin/lab", "bin/test", "ansible-playbook site.yml -i inventory/example",
                    "ansible-playbook train.yml -i inventory/example"):
        assert command in first, command
    assert re.search(r"^exec bin/test$", (REPO / ".ci/run").read_text(), re.M)


def test_the_map_parser_reads_entries_and_skips_continuations() -> None:
    text = ("# t\n\n## Layout\n\n    a.yml, b/    x\n                 more of x\n    c/           y\n\n"
            "## Next\n    d/  z\n")
    assert layout_entries(text) == (3, ["a.yml", "b/", "c/"])
