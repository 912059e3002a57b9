"""The GPU checks' CPU mode, in CI: `bench/gpu_check.sh --cpu` runs `pytest -m gpu tests/dflash/test_gpu.py`
with GPU_CHECK_DEVICE=cpu and `bench/gpu_dflash.py --tiny` on one and two ranks (FSDP2 over gloo), the same
code a GPU machine runs, so a script that would fail on the GPU before measuring anything fails here first.
The benchmark's target construction is checked in-process: materialised once, from bf16 meta parameters.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
GPU_TESTS = {  # test_gpu.py's tests and what the CPU mode must report for each
    "test_compiled_flex_matches_dense_sdpa": "passed",
    "test_fused_loss_under_bf16_autocast_matches_full_logits[data-0.0]": "passed",
    "test_fused_loss_under_bf16_autocast_matches_full_logits[target-1.0]": "passed",
    "test_fsdp_bf16_mixed_precision_step_matches_plain_drafter": "passed",
    "test_peak_table_knows_this_gpu": "skipped",
    "test_inductor_compiles_once_per_padded_length_over_mixed_steps": "passed",
}


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_dflash", REPO / "bench/gpu_dflash.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """{test name: (passed | skipped | failed, message)} from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, message = ("skipped" if tag == "skipped" else "failed"), el.get("message", "")
        out[case.get("name", "")] = (outcome, message)
    return out


@pytest.mark.slow
def test_gpu_check_cpu_mode_runs_every_gpu_script(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "bench/gpu_check.sh"), "--cpu", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable})
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    outcomes = _junit_outcomes(out / "gpu_pytest.xml")
    assert {k: v[0] for k, v in outcomes.items()} == GPU_TESTS, outcomes
    assert "a CPU has no entry" in outcomes["test_peak_table_knows_this_gpu"][1]
    log = (out / "gpu_check.log").read_text()
    for ranks in (1, 2):
        fig: dict[str, Any] = json.loads((out / f"gpu_dflash-tiny-cpu-{ranks}rank.json").read_text())
        assert (fig["ranks"], fig["strategy"], fig["backend"], fig["autocast"]) == (
            ranks, "fsdp", "gloo", "bfloat16"), fig
        assert fig["step_s"] > 0 and fig["first_step_s"] > 0 and fig["tokens_per_s"] > 0, fig
        assert fig["losses"] and all(math.isfinite(x) and x > 0 for x in fig["losses"]), fig
        assert fig["plan_gb_this_layout"] > 0 and fig["plan_gb_production_rank"] > 0, fig
        assert fig["peak_reserved_gb"] is None and fig["mfu"] is None  # CUDA-only figures say so
        assert f"x {ranks} rank(s), fsdp over gloo, autocast bfloat16" in log
    assert log.count("['torch.bfloat16']) in") == 2  # the target's parameters, as built, in both runs
    assert re.search(r"step [0-9.]+s: [0-9,]+ tokens/s, [0-9.]+ samples/s per rank", log)
    assert re.search(r"peak memory n/a \(not CUDA\); plan [0-9.]+ GB for this layout", log)


def test_bench_target_is_materialised_once_from_bf16_meta_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fp32 copy of the target ever gets storage: to_empty() runs once, on parameters that are bf16 and
    still on meta; the result is bf16, initialised (finite, not all zero), rotary frequencies in fp32."""
    bench = _bench()
    seen: list[set[tuple[torch.dtype, str]]] = []
    to_empty = torch.nn.Module.to_empty

    def spy(self: torch.nn.Module, *, device: Any, recurse: bool = True) -> torch.nn.Module:
        seen.append({(p.dtype, p.device.type) for p in self.parameters()})
        return to_empty(self, device=device, recurse=recurse)

    monkeypatch.setattr(torch.nn.Module, "to_empty", spy)
    model = bench.build_target(bench.TINY, torch.device("cpu"), torch.bfloat16)
    assert seen == [{(torch.bfloat16, "meta")}]
    params = dict(model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert all(torch.isfinite(p).all() for p in params.values())
    assert params["model.embed_tokens.weight"].float().std() > 0.01
    inv = model.model.rotary_emb.inv_freq
    assert inv.dtype == torch.float32 and torch.isfinite(inv).all() and inv.max() == 1.0
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(16)[None]).logits.float()).all()


def test_bench_27b_target_constructs_in_bf16_and_is_cut_to_fit_an_80gb_card() -> None:
    """The real 27B config (meta, no storage) builds with this transformers and only bf16 parameters; the
    plan cuts it to fit an 80 GB H100 (85.5e9 bytes) with one rank, and leaves it whole on an H200."""
    bench = _bench()
    model = bench.construct_target(bench.QWEN36_27B, torch.bfloat16)
    params = list(model.parameters())
    assert {(p.dtype, p.device.type) for p in params} == {(torch.bfloat16, "meta")}
    assert 26.5e9 < sum(p.numel() for p in params) < 27.5e9
    for gb, whole in ((85.5, False), (150.1, True)):
        cfg = bench.run_config(False, 4096, 512, gb, 1, "fsdp", "cuda", "bfloat16")
        layers = bench.fit_target_layers(cfg, dict(bench.QWEN36_27B), gb)
        assert (layers == 64) is whole and layers % 4 == 0 and layers >= 8
        plan = bench.plan_for(cfg, {**bench.QWEN36_27B, "num_hidden_layers": layers}, gb)
        assert plan.gpus[0].total <= 0.95 * gb * 1e9

