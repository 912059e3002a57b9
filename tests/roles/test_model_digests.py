"""Role model's fetch helper (roles/model/files/model_fetch.py) keeps a sha256 per file in the manifest, and
`stage` serves only those bytes: a same-size change to a staged shard, a staged directory another user made
in the world-writable /dev/shm, and a source whose bytes changed under its manifest are each caught. The
real helper on real files; the other user is real where the test runs as root (chown to `daemon`)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def m() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_fetch", ROOT / "roles/model/files/model_fetch.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def model(tmp_path: Path, m: ModuleType) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "qwen3"}')
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 8}, "weight_map": {"a": "s1.safetensors"}}))
    (src / "s1.safetensors").write_bytes(b"abcdefgh")
    m.fetch(str(src), tmp_path / "model")
    return tmp_path / "model"


def test_the_manifest_holds_the_sha256_of_every_file(m: ModuleType, model: Path) -> None:
    manifest = json.loads((model / ".model.json").read_text())
    assert set(manifest["sha256"]) == set(manifest["files"]) == {
        "config.json", "model.safetensors.index.json", "s1.safetensors"}
    assert manifest["sha256"]["s1.safetensors"] == (
        "9c56cc51b374c3ba189210d5b6d4bf57790d351c96c47c02190ecf1e430635ab")  # sha256sum of b"abcdefgh"


def test_a_manifest_without_digests_does_not_verify(m: ModuleType, model: Path) -> None:
    manifest = json.loads((model / ".model.json").read_text())
    del manifest["sha256"]
    (model / ".model.json").write_text(json.dumps(manifest))
    with pytest.raises(m.ModelError, match=r"no sha256 for every file .*fetch again"):
        m.verify(model)


def test_a_same_size_change_to_a_staged_shard_is_staged_again(
    m: ModuleType, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    staged = tmp_path / "shm" / "model"
    m.stage(model, staged)
    assert (staged.stat().st_mode & 0o777) == 0o700
    (staged / "s1.safetensors").write_bytes(b"ABCDEFGH")  # same size: a size check keeps it
    m.stage(model, staged)
    assert (staged / "s1.safetensors").read_bytes() == b"abcdefgh"
    assert "s1.safetensors: content differs from the model's manifest" in capsys.readouterr().err


def test_a_source_changed_under_its_manifest_is_not_served(
    m: ModuleType, model: Path, tmp_path: Path
) -> None:
    (model / "s1.safetensors").write_bytes(b"ABCDEFGH")
    with pytest.raises(m.ModelError, match=r"s1.safetensors: content differs from the model's manifest"):
        m.stage(model, tmp_path / "shm" / "model")


def test_a_link_planted_in_the_model_is_neither_listed_nor_staged(
    m: ModuleType, model: Path, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").write_text("not the model's")
    (model / "planted.json").symlink_to(tmp_path / "elsewhere")
    staged = tmp_path / "shm" / "model"
    m.stage(model, staged)
    assert not (staged / "planted.json").exists()
    assert "planted.json" not in m.scan(model, links=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's directory needs root to make")
def test_a_stage_directory_another_user_made_is_refused(m: ModuleType, model: Path, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o1777)
    os.chmod(shm, 0o1777)  # as /dev/shm: anyone may create an entry
    staged = shm / "model"
    shutil.copytree(model, staged)  # a perfect copy, so only its owner can give it away
    shutil.chown(staged, "daemon")
    with pytest.raises(m.ModelError, match=r"made by uid \d+ .*not by this service's user .*remove it"):
        m.stage(model, staged)
    assert staged.stat().st_uid != 0  # left as found, for whoever looks into it


def test_a_stage_directory_others_may_write_is_refused(m: ModuleType, model: Path, tmp_path: Path) -> None:
    staged = tmp_path / "shm" / "model"
    m.stage(model, staged)
    staged.chmod(0o777)
    with pytest.raises(m.ModelError, match=r"mode 777"):
        m.stage(model, staged)
