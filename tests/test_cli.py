"""`python -m trainer` as users call it: help, config check, clear errors and exit codes."""
from __future__ import annotations

import subprocess
import sys


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, cwd=cwd)


def test_help_lists_the_subcommands():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    for cmd in ("run", "check", "generate", "prepare", "train", "eval"):
        assert cmd in r.stdout


def test_check_accepts_a_valid_config(tmp_path):
    p = tmp_path / "ok.yml"
    p.write_text("target:\n  path: /m\nstages: [train]\n")
    r = run("check", str(p))
    assert r.returncode == 0, r.stderr
    assert "ok (run ok" in r.stdout


def test_unknown_key_exits_2_naming_the_key(tmp_path):
    p = tmp_path / "bad.yml"
    p.write_text("target:\n  path: /m\ntrain:\n  lrr: 1\n")
    r = run("check", str(p))
    assert r.returncode == 2
    assert "unknown key train.lrr" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_file_is_a_clear_error(tmp_path):
    r = run("check", str(tmp_path / "nope.yml"))
    assert r.returncode == 2
    assert "nope.yml: cannot read run config" in r.stderr


def test_make_tiny_target_saves_a_loadable_model_and_tokenizer(tmp_path):
    out = tmp_path / "tiny"
    r = run("make-tiny-target", str(out))
    assert r.returncode == 0, r.stderr
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert cfg.model_type.startswith("qwen3_5")
    assert len(tok) <= cfg.vocab_size
    unreadable = [f.name for f in out.iterdir() if f.stat().st_mode & 0o044 != 0o044]
    assert not unreadable, f"model files must be readable by all: {unreadable}"
    assert tok.convert_tokens_to_ids("<|im_end|>") < cfg.vocab_size
    again = run("make-tiny-target", str(out))
    assert again.returncode == 0 and "already there" in again.stdout
