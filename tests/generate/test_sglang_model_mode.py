"""The generator against the SGLang double in model mode (`--model-dir`): the answers are what a real model
directory decodes, so the thinking split, the finish reasons and max_tokens come from real tokens.

The model is a tiny Qwen3.5 target (trainer/dflash/tiny.py) with the tiny tokenizer, trained here to
overfit two chat answers with a thinking; its greedy decode then writes them back token for token.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genhelpers import DOUBLE, Double, read_output, write_run
from test_run import run_stage

pytestmark = pytest.mark.slow

ANSWERS = {  # user turn -> (reasoning, answer) the model learns to write
    "say hi": ("they greet me, so I greet back", "hi there, friend"),
    "count to three": ("one, then two, then three", "1 2 3"),
}


def chat(tok: Any, user: str, reasoning: str, answer: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": user},
                                    {"role": "assistant", "content": answer, "reasoning_content": reasoning}],
                                   tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from torch.nn import functional as F

    from trainer.data.tiny_tokenizer import build_tiny_tokenizer
    from trainer.dflash.tiny import build_tiny_model

    torch.set_num_threads(2)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(512, seed=0, num_hidden_layers=2,
                             layer_types=["linear_attention", "full_attention"]).train()
    seqs = [chat(tok, u, r, a) for u, (r, a) in ANSWERS.items()]
    n = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (n - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs])
    labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    out = tmp_path_factory.mktemp("model")
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


class ModelDouble(Double):
    """The double in model mode: it loads torch and the model before it answers, so it waits longer."""

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(DOUBLE), "--port", str(self.port), *self.args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1):
                    return
            except OSError:
                assert self.proc.poll() is None, f"the double exited with {self.proc.returncode}"
                time.sleep(0.2)
        raise RuntimeError(f"SGLang double on {self.url} did not come up")


@pytest.fixture
def sglang() -> Iterator[Any]:
    started: list[Double] = []

    def make(*args: str) -> Double:
        started.append(ModelDouble(list(args)))
        return started[-1]

    yield make
    for d in started:
        d.stop()


def prompts(path: Path) -> Path:
    with path.open("w") as fh:
        for i, user in enumerate(ANSWERS):
            fh.write(json.dumps({"id": f"m{i}", "messages": [{"role": "user", "content": user}]}) + "\n")
    return path


def generate(tmp_path: Path, sglang: Any, model_dir: Path, *args: str, **gen: Any) -> dict[str, dict]:
    d = sglang("--model-dir", str(model_dir), *args)
    rc, summary = run_stage(write_run(tmp_path, prompts(tmp_path / "p.jsonl"), [d.url], temperature=0.0,
                                      format="jsonl", **gen))
    assert rc == 0, summary
    return {r["id"]: r for r in read_output(tmp_path / "run" / "generated")}


def test_model_mode_writes_the_models_answer_split_at_think(tmp_path: Path, sglang: Any,
                                                            model_dir: Path) -> None:
    records = generate(tmp_path, sglang, model_dir, "--reasoning-parser", "qwen3")
    for i, (user, (reasoning, answer)) in enumerate(ANSWERS.items()):
        r = records[f"m{i}"]
        assert r["messages"][0] == {"role": "user", "content": user}
        msg = r["messages"][-1]
        # the parser keeps the reasoning as written up to </think> (the template's newline included)
        assert (msg["reasoning_content"].strip(), msg["content"]) == (reasoning, answer)
        assert r["finish_reason"] == "stop"


def test_model_mode_without_parser_keeps_the_thinking_inline(tmp_path: Path, sglang: Any,
                                                             model_dir: Path) -> None:
    records = generate(tmp_path, sglang, model_dir)
    reasoning, answer = ANSWERS["say hi"]
    msg = records["m0"]["messages"][-1]
    # the generator splits the inline thinking itself (trainer/generate/endpoints.py parse_completion)
    assert (msg["reasoning_content"].strip(), msg["content"]) == (reasoning, answer)


def test_model_mode_max_tokens_ends_inside_the_thinking_with_length(tmp_path: Path, sglang: Any,
                                                                     model_dir: Path) -> None:
    records = generate(tmp_path, sglang, model_dir, "--reasoning-parser", "qwen3", max_tokens=4)
    for r in records.values():
        assert r["finish_reason"] == "length"
        assert r["usage"]["completion_tokens"] == 4
        msg = r["messages"][-1]
        full = ANSWERS[r["messages"][0]["content"]][0]
        # cut inside the thinking: no </think>, so all of it is reasoning and the answer is empty
        assert msg["content"] == "" and full.startswith(msg["reasoning_content"]) and msg["reasoning_content"]
