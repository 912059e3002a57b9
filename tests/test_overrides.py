"""`--overrides FILE.yml`: a mapping merged over the run file by the same strict loader; --set wins."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer.cli import build_parser, load_from_args, main
from trainer.config import ConfigError, load_run_config

RUN = "target:\n  path: /models/tiny\nseed: 1\ns3:\n  bucket: b\n  concurrency: 4\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_precedence_run_file_then_overrides_file_then_set(tmp_path):
    run = write(tmp_path, "run.yml", RUN)
    over = write(tmp_path, "over.yml", "seed: 2\ns3:\n  concurrency: 9\n")
    cfg = load_run_config(run, ["seed=3"], [over])
    assert cfg.seed == 3  # --set beats the overrides file
    assert cfg.s3.concurrency == 9  # the overrides file beats the run file
    assert cfg.s3.bucket == "b"  # a section is merged key by key, not replaced
    assert load_run_config(run, (), [over]).seed == 2


def test_later_overrides_files_win_and_lists_replace(tmp_path):
    run = write(tmp_path, "run.yml", RUN + "generate:\n  endpoints: [http://a:1, http://b:1]\n")
    one = write(tmp_path, "one.yml", "generate:\n  endpoints: [http://c:1]\n  max_tokens: 10\n")
    two = write(tmp_path, "two.yml", "generate:\n  max_tokens: 20\n")
    cfg = load_run_config(run, (), [one, two])
    assert cfg.generate.endpoints == ("http://c:1",)
    assert cfg.generate.max_tokens == 20


def test_unknown_key_names_the_key_and_the_file(tmp_path):
    run = write(tmp_path, "run.yml", RUN)
    over = write(tmp_path, "inv.yml", "train:\n  placement:\n    nodes: 2\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(run, (), [over])
    assert str(e.value).startswith(f"{over}: unknown key train.placement.nodes")
    top = write(tmp_path, "top.yml", "tragets: 1\n")
    with pytest.raises(ConfigError, match=r"top\.yml: unknown key tragets"):
        load_run_config(run, (), [top])


def test_ill_typed_value_names_the_file(tmp_path):
    run = write(tmp_path, "run.yml", RUN)
    over = write(tmp_path, "inv.yml", "s3:\n  concurrency: many\n")
    with pytest.raises(ConfigError, match=r"inv\.yml: s3\.concurrency: expected an integer"):
        load_run_config(run, (), [over])
    section = write(tmp_path, "sec.yml", "s3: 5\n")
    with pytest.raises(ConfigError, match=r"sec\.yml: s3: expected a mapping"):
        load_run_config(run, (), [section])


@pytest.mark.parametrize("text, why", [
    ("s3: [unclosed\n", "not valid YAML"),
    ("- a\n- b\n", "overrides file must be a mapping, got list"),
])
def test_malformed_overrides_file(tmp_path, text, why):
    run = write(tmp_path, "run.yml", RUN)
    over = write(tmp_path, "bad.yml", text)
    with pytest.raises(ConfigError, match=why) as e:
        load_run_config(run, (), [over])
    assert "bad.yml" in str(e.value)


def test_missing_overrides_file(tmp_path):
    run = write(tmp_path, "run.yml", RUN)
    with pytest.raises(ConfigError, match=r"nope\.yml: cannot read overrides file"):
        load_run_config(run, (), [tmp_path / "nope.yml"])


def test_cross_field_checks_still_run_after_the_merge(tmp_path):
    run = write(tmp_path, "run.yml", "target:\n  path: /m\n")
    over = write(tmp_path, "over.yml", "train:\n  upload_checkpoints: true\n")
    with pytest.raises(ConfigError, match=r"s3\.bucket is empty"):
        load_run_config(run, (), [over])


@pytest.mark.parametrize("command", ["run", "check", "plan", "generate", "prepare", "train", "eval"])
def test_every_run_subcommand_takes_overrides_and_set(tmp_path, command):
    run = write(tmp_path, "run.yml", RUN)
    over = write(tmp_path, "over.yml", "seed: 5\ns3:\n  concurrency: 6\n")
    args = build_parser().parse_args([command, str(run), "--overrides", str(over), "--set=seed=7"])
    cfg = load_from_args(args)
    assert (cfg.seed, cfg.s3.concurrency) == (7, 6)


def test_check_refuses_a_bad_overrides_file_with_exit_2(tmp_path, capsys):
    run = write(tmp_path, "run.yml", RUN)
    over = write(tmp_path, "over.yml", "generate:\n  endpoint: [http://a:1]\n")
    assert main(["check", str(run), "--overrides", str(over)]) == 2
    err = capsys.readouterr().err
    assert f"{over}: unknown key generate.endpoint;" in err
