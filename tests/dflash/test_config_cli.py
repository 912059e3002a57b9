"""Run config of the trainer sections: unknown / ill-typed keys named, --set overrides, derived
drafter sizes; the `train` CLI (torchrun line from the placement); the SGLang export layout."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainer.config import ConfigError, load_run_config

REPO = Path(__file__).resolve().parents[2]
OVERFIT = REPO / "tests/fixtures/runs/overfit.yml"


def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "run.yml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_unknown_key_is_named(tmp_path: Path) -> None:
    data = yaml.safe_load(OVERFIT.read_text())
    data["drafter"]["blok_size"] = 8
    with pytest.raises(ConfigError, match=r"unknown key drafter\.blok_size"):
        load_run_config(_write(tmp_path, data))
    data["drafter"].pop("blok_size")
    data["train"]["placement"] = {"target_gpu": [0]}
    with pytest.raises(ConfigError, match=r"unknown key train\.placement\.target_gpu"):
        load_run_config(_write(tmp_path, data))


def test_ill_typed_and_invalid_values_are_named(tmp_path: Path) -> None:
    p = OVERFIT
    with pytest.raises(ConfigError, match=r"train\.lr: expected a number"):
        load_run_config(p, ["train.lr=fast"])
    with pytest.raises(ConfigError, match=r"loss\.noise: 'pink' is not one of"):
        load_run_config(p, ["loss.noise=pink"])
    with pytest.raises(ConfigError, match=r"drafter\.block_size must be >= 2"):
        load_run_config(p, ["drafter.block_size=1"])
    with pytest.raises(ConfigError, match=r"drafter.layer_types has 1 entries"):
        load_run_config(p, ["drafter.layer_types=[full_attention]"])


def test_overrides_go_through_the_loader() -> None:
    cfg = load_run_config(OVERFIT, ["train.lr=1e-4", "loss.dpace=true",
                                                            "train.placement.target_gpus=[0,1]"])
    assert cfg.train.lr == 1e-4 and cfg.loss.dpace and cfg.train.placement.target_gpus == (0, 1)


def test_drafter_sizes_derive_from_target() -> None:
    from trainer.dflash.config import DrafterConfig
    from trainer.dflash.drafter import resolve_arch
    from trainer.dflash.tiny import tiny_target_config

    tcfg = tiny_target_config()
    a = resolve_arch(DrafterConfig(num_layers=3, mask_token_id=5), tcfg, (1, 3, 5), 512)
    assert (a.hidden_size, a.intermediate_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim) == \
        (64, 128, 4, 2, 16)
    assert a.layer_types == ("sliding_attention", "sliding_attention", "full_attention")
    assert a.rope_theta == 10000.0
    with pytest.raises(ValueError, match=r"drafter.mask_token_id=248070 is outside the target vocabulary"):
        resolve_arch(DrafterConfig(), tcfg, (1, 5), 512)


def test_torchrun_line_from_placement(tmp_path) -> None:
    import sys

    from trainer.dflash.stage import torchrun_command
    from trainer.layout import RunLayout

    cfg = load_run_config(OVERFIT, [
        "train.placement.nnodes=2", "train.placement.nproc_per_node=4",
        "train.placement.rdzv_endpoint=10.0.0.1:29400", f"run_dir={tmp_path}"])
    assert cfg.train.placement.launches_torchrun and cfg.train.placement.world_size == 8
    cmd = torchrun_command(cfg, node_rank=1)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[3:11] == ["--nnodes=2", "--nproc-per-node=4", "--max-restarts=0", "--shutdown-timeout=270",
                         "--rdzv-backend=static", "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=overfit",
                         "--node-rank=1"]
    launch_config = RunLayout.of(cfg).launch_config
    assert cmd[-5:] == ["-m", "trainer", "train", str(launch_config), "--resume"]
    assert load_run_config(launch_config).train.placement.node_rank == 1  # the line's config is resolved
    one = load_run_config(OVERFIT, ["train.placement.nproc_per_node=2",
                                                            f"run_dir={tmp_path}"])
    assert "--standalone" in torchrun_command(one)
    assert not load_run_config(OVERFIT).train.placement.launches_torchrun
    with pytest.raises(ConfigError, match=r"node_rank=2 is not in 0\.\.1"):
        load_run_config(OVERFIT, ["train.placement.nnodes=2",
                                                          "train.placement.node_rank=2"])


def test_torchrun_root_cause_is_parsed() -> None:
    from trainer.dflash.launch import root_cause

    report = """Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_06:00:00
  host      : ct200
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
"""
    assert root_cause(report) == (1, 1, -9)
    assert root_cause("no report here") is None


def test_export_layout_is_what_sglang_loads(tmp_path: Path) -> None:
    from safetensors import safe_open

    from trainer.dflash.config import DrafterConfig
    from trainer.dflash.drafter import build_drafter
    from trainer.dflash.export import export_for_sglang
    from trainer.dflash.target import TargetModel
    from trainer.dflash.tiny import build_tiny_model

    target = TargetModel(build_tiny_model(), (1, 5))
    d = build_drafter(DrafterConfig(num_layers=2, block_size=8, mask_token_id=500), target)
    out = export_for_sglang(d.trainable_state_dict(), d.arch, tmp_path / "export")
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["DFlashDraftModel"]
    assert conf["num_hidden_layers"] == 2 and conf["hidden_size"] == 64
    assert conf["dflash_config"] == {"mask_token_id": 500, "target_layer_ids": [1, 5], "num_target_layers": 8,
                                     "block_size": 8}
    assert conf["layer_types"] == ["sliding_attention", "full_attention"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("fc.weight").shape == (64, 128)  # K=2 features x hidden -> hidden
        assert str(f.get_tensor("norm.weight").dtype) == "torch.bfloat16"
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(2):
        p = f"layers.{i}."
        expected |= {p + f"self_attn.{n}_proj.weight" for n in "qkvo"}
        expected |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
        expected |= {p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
        expected |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
    assert keys == expected  # no embed_tokens / lm_head: SGLang uses the target's


def test_wandb_offline_logging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.config import WandbConfig
    from trainer.dflash.metrics import MetricsLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = MetricsLogger(tmp_path / "metrics.jsonl", 10, 0, enabled=True, progress=False,
                           wandb_cfg=WandbConfig(project="dflash-test", mode="offline"), run_name="t")
    logger.step(1, {"loss": 1.0, "lr": 1e-3})
    line = logger.log(1, {"loss": 1.0, "tau": 1.5, "slot_acc": [0.5, 0.2], "tokens_per_s": 5.0, "eta_s": 3.0,
                          "mfu": None}, 1e-3)
    logger.close()
    assert line["eta_s"] == 3.0 and line["tau"] == 1.5
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_one_device_at_a_time_runs_once_without_a_process_group() -> None:
    import torch

    from trainer.dflash import device as dev

    calls: list[int] = []
    rt = dev.Runtime(torch.device("cpu"), torch.device("cpu"))
    dev.one_device_at_a_time(rt, lambda: calls.append(1))
    dev.warm_up_target(rt, None)  # CPU: a no-op (never touches the target)
    assert calls == [1]
    assert dev.dist_backend(rt) == "gloo" and not dev.flex_enabled(rt.device)


QWEN36_CONFIG = REPO / "tests/fixtures/qwen36-27b/config.json"


def test_qwen36_27b_drafter_defaults_follow_specforge() -> None:
    """The default drafter for Qwen3.6-27B is SpecForge's configs/qwen3.6-27b-dflash.json: 5 layers,
    hidden 5120, 32 heads x 128, 8 KV heads, FFN 17408, [sliding x4, full], window 2048, rope 1e7 —
    not the target's own 24 x 256 / 4 KV attention."""
    import json
    from types import SimpleNamespace

    from trainer.dflash.config import DrafterConfig
    from trainer.dflash.drafter import resolve_arch
    from trainer.dflash.target import default_layer_ids

    tcfg = SimpleNamespace(**json.loads(QWEN36_CONFIG.read_text())["text_config"])
    assert (tcfg.num_attention_heads, tcfg.num_key_value_heads, tcfg.head_dim) == (24, 4, 256)
    ids = default_layer_ids(tcfg.num_hidden_layers, 5)
    a = resolve_arch(DrafterConfig(), tcfg, ids, tcfg.vocab_size)
    assert ids == (1, 16, 31, 46, 61)
    assert (a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.intermediate_size) == \
        (5120, 32, 8, 128, 17408)
    assert a.layer_types == ("sliding_attention",) * 4 + ("full_attention",)
    assert (a.sliding_window, a.rope_theta, a.block_size, a.mask_token_id) == (2048, 1e7, 16, 248070)
    # an explicit setting still wins
    b = resolve_arch(DrafterConfig(num_attention_heads=40, num_key_value_heads=8), tcfg, ids, tcfg.vocab_size)
    assert (b.num_attention_heads, b.num_key_value_heads, b.head_dim) == (40, 8, 128)


def test_adamw_betas_follow_specforge() -> None:
    import torch

    from trainer.dflash.config import TrainConfig
    from trainer.dflash.optim import build_optimizer

    assert TrainConfig().betas == (0.9, 0.999)
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], TrainConfig())
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
    assert opt.param_groups[0]["weight_decay"] == 0.0
