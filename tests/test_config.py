"""The strict run-config loader: unknown/ill-typed keys fail with the key named; --set goes through it."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import ConfigError, RunConfig, load_run_config, to_dict
from trainer.layout import RunLayout

MINIMAL = "target:\n  path: /models/tiny\n"


def write(tmp_path: Path, text: str, name: str = "run.yml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_minimal_config_loads_with_defaults(tmp_path):
    cfg = load_run_config(write(tmp_path, MINIMAL, "myrun.yml"))
    assert isinstance(cfg, RunConfig)
    assert cfg.name == "myrun"
    assert cfg.target.path == "/models/tiny"
    assert RunLayout.of(cfg).root == Path("runs/myrun")
    assert cfg.s3.enabled is False


def test_unknown_top_level_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key tragets"):
        load_run_config(write(tmp_path, MINIMAL + "tragets: 1\n"))


def test_unknown_nested_key_is_named_with_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key s3\.bukcet"):
        load_run_config(write(tmp_path, MINIMAL + "s3:\n  bukcet: x\n"))


def test_ill_typed_value_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"s3\.concurrency: expected an integer, got 'many'"):
        load_run_config(write(tmp_path, MINIMAL + "s3:\n  concurrency: many\n"))


def test_bad_literal_lists_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"stages\[1\]: 'trian' is not one of"):
        load_run_config(write(tmp_path, MINIMAL + "stages: [generate, trian]\n"))


def test_missing_required_key(tmp_path):
    with pytest.raises(ConfigError, match=r"missing required key target"):
        load_run_config(write(tmp_path, "seed: 1\n"))


def test_set_overrides_are_validated_the_same_way(tmp_path):
    p = write(tmp_path, MINIMAL)
    cfg = load_run_config(p, ["s3.concurrency=7", "seed=3", "target.path=/elsewhere"])
    assert (cfg.s3.concurrency, cfg.seed, cfg.target.path) == (7, 3, "/elsewhere")
    with pytest.raises(ConfigError, match=r"unknown key s3\.nope"):
        load_run_config(p, ["s3.nope=1"])
    with pytest.raises(ConfigError, match=r"expected key=value"):
        load_run_config(p, ["seed"])


def test_malformed_yaml_names_the_file(tmp_path):
    p = write(tmp_path, "target: [unclosed\n")
    with pytest.raises(ConfigError, match=str(p)):
        load_run_config(p)


def test_round_trip_through_to_dict(tmp_path):
    cfg = load_run_config(write(tmp_path, MINIMAL + "stages: [generate, prepare]\n"))
    (tmp_path / "again").mkdir()
    again = load_run_config(write(tmp_path / "again", __import__("yaml").safe_dump(to_dict(cfg))))
    assert again == cfg


@pytest.mark.parametrize("path", sorted(Path("files/runs").glob("*.yml")), ids=lambda p: p.name)
def test_every_shipped_run_config_is_valid(path):
    cfg = load_run_config(path)
    assert cfg.name == path.stem


# --- staging: the unit deletes the staged copy before and after every run, so it never overlaps the model


@pytest.mark.parametrize("stage_to", ["/models/tiny", "/models/tiny/", "/models/tiny/cache", "/models"])
def test_stage_to_overlapping_the_model_is_refused(tmp_path: Path, stage_to: str) -> None:
    # /models: the run's directory would be /models/tiny, the model itself
    run = tmp_path / "tiny.yml"
    run.write_text(f"target: {{path: /models/tiny, stage_to: {stage_to}}}\n")
    with pytest.raises(ConfigError, match=r"target.stage_to: .* overlaps target.path '/models/tiny'"):
        load_run_config(run)


def test_stage_to_must_be_absolute(tmp_path: Path) -> None:
    run = tmp_path / "tiny.yml"
    run.write_text("target: {path: /models/tiny, stage_to: shm}\n")
    with pytest.raises(ConfigError, match=r"target\.stage_to: 'shm' is not an absolute path"):
        load_run_config(run)


def test_each_run_stages_into_its_own_directory(tmp_path: Path) -> None:
    from trainer.report import staging

    for name in ("a", "b"):
        run = tmp_path / f"{name}.yml"
        run.write_text("target: {path: /models/tiny, stage_to: /dev/shm/}\n")
        assert staging(load_run_config(run)) == {
            "path": "/models/tiny", "stage_to": "/dev/shm/", "source": "/models/tiny",
            "destination": f"/dev/shm/{name}/tiny"}
