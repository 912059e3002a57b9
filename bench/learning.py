"""Does a drafter trained by this pipeline learn to draft for its target, on data it never saw?

    python bench/learning.py [--corpus FILE] [--out DIR] [--target-steps N] [--steps N] [--threads N]

A random target has nothing to learn (tau about 1 whatever the drafter does), so this bench first makes
a target worth drafting for: a small Qwen3.5-architecture model (trainer/dflash/tiny.py's sizes, its own
byte-level BPE tokenizer with the tiny tokenizer's special tokens and Qwen3-like chat template) trained on
the CPU on a language with structure, as chat turns: the first words of a line are the user turn, the
rest of the line is the assistant's answer (with an empty thinking, as the template renders it). It is
saved as a model directory the trainer loads like a real one (config.json, safetensors, tokenizer).

The built-in language walks a fixed ordering of 48 made-up words with a step of 1 to 4: the user gives
three words, the answer continues with the same step until the end of the ordering. The next word
follows from the last two, so a target can learn it and a drafter can predict several words ahead;
held-out prompts are walks the target and the drafter never saw (their transitions are shared).
`--corpus FILE` (text lines) replaces it.

Then the whole pipeline as a user runs it, through the trainer's own stages (`run_stages` of trainer/cli.py):
  generate  the prompts against the SGLang double in model mode (tests/doubles/sglang_server.py
            --model-dir: the target itself decodes, greedy, thinking split by the qwen3 parser)
  prepare   with data.heldout_share: whole conversations held out of training
  train     one run per loss variant (CE; CE+KL to the target's soft labels; CE with D-PACE weights),
            the same seed, data and steps
  eval      tau on the held-out shards
and prints a table: held-out tau, per-slot greedy acceptance, the target's own held-out loss per
supervised token, against two baselines: the drafter before any step (untrained) and a drafter trained
the same way for a random target with the same tokenizer. Timings per stage are printed with it.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOUBLE = ROOT / "tests" / "doubles" / "sglang_server.py"
TARGET_LAYERS = 4  # 3 gated-DeltaNet + 1 gated attention layer: one period of Qwen3.5's pattern
VOCAB = 512  # the target's vocabulary (the tiny target's); the tokenizer is trained to fit below it
VARIANTS = {  # loss: sections of the run config (trainer/dflash/config.py LossConfig)
    "CE": {"ce_weight": 1.0, "kl_weight": 0.0},
    "CE+KL": {"ce_weight": 1.0, "kl_weight": 1.0},
    "D-PACE": {"ce_weight": 1.0, "kl_weight": 0.0, "dpace": True},
}
log = logging.getLogger("bench.learning")


# -- the language -----------------------------------------------------------------------------------
def builtin_lines(seed: int = 0, words: int = 48, steps: tuple[int, ...] = (1, 2, 3, 4)) -> list[str]:
    """Every walk of a fixed ordering of `words` made-up words: 3 words given, at least 3 to continue."""
    rng = random.Random(seed)
    syll = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    vocab = sorted({rng.choice(syll) + rng.choice(syll) for _ in range(words * 4)})
    order = rng.sample(vocab, words)
    lines = []
    for d in steps:
        for s in range(words):
            walk = order[s::d]
            if len(walk) >= 6:
                lines.append(" ".join(walk))
    rng.shuffle(lines)
    return lines


def read_corpus(path: Path, prompt_words: int) -> list[str]:
    if not path.is_file():
        raise SystemExit(f"--corpus: {path} is not a file")
    lines = [" ".join(x.split()) for x in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    lines = list(dict.fromkeys(x for x in lines if len(x.split()) >= prompt_words + 3))
    if len(lines) < 20:
        raise SystemExit(f"--corpus: {path} has {len(lines)} distinct lines of >= {prompt_words + 3} words; "
                         "at least 20 are needed")
    return lines


def turns(line: str, prompt_words: int) -> tuple[str, str]:
    """(user, assistant) of a line: its first words, then the rest."""
    w = line.split()
    return " ".join(w[:prompt_words]), " ".join(w[prompt_words:])


# -- the target -------------------------------------------------------------------------------------
def build_tokenizer(lines: list[str]) -> Any:
    """Byte-level BPE trained on `lines`, the tiny tokenizer's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainer.data.tiny_tokenizer import CHAT_TEMPLATE, MASK_TOKEN, SPECIAL_TOKENS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([*lines, "<think>\n\n</think>\n\n"], trainer=trainers.BpeTrainer(
        vocab_size=VOCAB - 16 - len(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<think>", "</think>", MASK_TOKEN],
        model_max_length=131072, clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def chat_ids(tok: Any, user: str, answer: str) -> tuple[list[int], int]:
    """The rendered conversation's ids and how many of them are the prompt (up to the assistant header)."""
    prompt = [{"role": "user", "content": user}]
    text = tok.apply_chat_template([*prompt, {"role": "assistant", "content": answer}], tokenize=False)
    head = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    ids = tok([text, head], add_special_tokens=False)["input_ids"]
    return list(ids[0]), len(ids[1])


def train_target(out: Path, tok: Any, lines: list[str], prompt_words: int, steps: int, seed: int) -> float:
    """Train a tiny Qwen3.5 target on the chat-rendered lines and save it to `out`; the last mean loss."""
    import torch
    from torch.nn import functional as F

    from trainer.dflash.tiny import build_tiny_model

    model = build_tiny_model(VOCAB, seed, num_hidden_layers=TARGET_LAYERS).train()
    seqs = [chat_ids(tok, *turns(x, prompt_words)) for x in lines]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    rng = random.Random(seed)
    pad = tok.pad_token_id
    recent: list[float] = []
    for step in range(steps):
        batch = rng.sample(seqs, min(8, len(seqs)))
        n = max(len(s) for s, _ in batch)
        ids = torch.tensor([s + [pad] * (n - len(s)) for s, _ in batch])
        mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s, _ in batch])
        # the loss reads the answer only (as the drafter's data does): the prompt's first words are random
        answer = torch.tensor([[0] * h + [1] * (len(s) - h) + [0] * (n - len(s)) for s, h in batch])
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        labels = ids[:, 1:].masked_fill(answer[:, 1:] == 0, -100)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        recent = [*recent, loss.item()][-20:]
        if step % 50 == 0 or step == steps - 1:
            log.info("target step %d/%d: loss %.3f", step + 1, steps, sum(recent) / len(recent))
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return sum(recent) / len(recent)


def target_loss(model_dir: Path, shards: Path) -> float:
    """The target's mean cross-entropy on the supervised (loss_mask) tokens of `shards`."""
    import torch
    from torch.nn import functional as F
    from transformers import AutoModelForCausalLM

    from trainer.data.shards import ShardDataset

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ds = ShardDataset.open(shards)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(ds)):
            row = ds[i]
            ids = torch.tensor([row["input_ids"]])
            mask = torch.tensor(row["loss_mask"][1:], dtype=torch.bool)
            logits = model(input_ids=ids).logits[0, :-1]
            ce = F.cross_entropy(logits, ids[0, 1:], reduction="none")
            total += float(ce[mask].sum())
            count += int(mask.sum())
    return total / max(1, count)


# -- the pipeline -----------------------------------------------------------------------------------
class ModelDouble:
    """The SGLang double in model mode on a free loopback port, for as long as the `with` lasts."""

    def __init__(self, model_dir: Path, log_file: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, str(DOUBLE), "--port", str(self.port), "--model-dir", str(model_dir),
                    "--reasoning-parser", "qwen3", "--max-running", "1", "--model", "learning-target"]
        self.log_file = log_file

    def __enter__(self) -> ModelDouble:
        self.err = self.log_file.open("wb")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the SGLang double exited with {self.proc.returncode}; "
                                   f"see {self.log_file}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1):
                    return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the SGLang double did not come up in 120 s; see {self.log_file}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.err.close()


def run_file(out: Path, name: str, body: dict[str, Any]) -> Any:
    import yaml

    from trainer.config import load_run_config

    path = out / f"{name}.yml"
    path.write_text(yaml.safe_dump({"name": name, **body}, sort_keys=False))
    return load_run_config(path)


def common(out: Path, target: Path, args: argparse.Namespace, mask_id: int) -> dict[str, Any]:
    """Run-config sections every run of the bench shares: the data, the drafter, train and eval sizes."""
    return {
        "target": {"path": str(target), "name": "learning-target", "dtype": "float32"},
        "seed": args.seed,
        "data": {"max_length": args.max_length, "num_workers": 1, "heldout_share": args.heldout_share,
                 "shards": str(out / "data" / "shards"),
                 "heldout_shards": str(out / "data" / "shards-heldout"),
                 "doctor": {"max_duplicate_share": 0.5, "max_mode_share": 0.9}},
        "drafter": {"num_layers": 2, "target_layer_ids": [0, 2], "block_size": args.block_size,
                    "mask_token_id": mask_id,
                    "max_anchors": args.anchors, "sliding_window": args.max_length},
        "train": {"lr": args.lr, "epochs": 1000, "max_steps": args.steps, "batch_size": args.batch_size,
                  "device": "cpu", "dtype": "float32", "log_every": max(1, args.steps // 4), "save_every": 0,
                  "keep_last": 1, "progress": False, "placement": {"strategy": "none"}},
        "eval": {"max_samples": args.eval_samples, "max_anchors": 64},
    }


def stage_time(timings: dict[str, float], name: str, t0: float) -> None:
    timings[name] = timings.get(name, 0.0) + time.monotonic() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from trainer.cli import run_stages
    from trainer.dflash.loop import Trainer
    from trainer.dflash.tiny import build_tiny_model
    from trainer.eval.acceptance import evaluate
    from trainer.layout import RunLayout

    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    lines = (read_corpus(args.corpus, args.prompt_words) if args.corpus
             else builtin_lines(args.seed, args.words))
    if args.max_lines:
        lines = lines[:args.max_lines]

    t0 = time.monotonic()
    tok = build_tokenizer(lines)
    target = out / "target"
    target_train_loss = train_target(target, tok, lines, args.prompt_words, args.target_steps, args.seed)
    random_target = out / "random-target"
    build_tiny_model(VOCAB, args.seed, num_hidden_layers=TARGET_LAYERS).save_pretrained(random_target)
    tok.save_pretrained(random_target)
    stage_time(timings, "target", t0)
    mask_id = tok.convert_tokens_to_ids("<|mask|>")

    prompts = out / "prompts.jsonl"
    with prompts.open("w") as f:
        for i, line in enumerate(lines):
            user, _ = turns(line, args.prompt_words)
            f.write(json.dumps({"id": f"p{i:05d}", "messages": [{"role": "user", "content": user}]}) + "\n")
    base = common(out, target, args, mask_id)
    with ModelDouble(target, out / "double.log") as double:
        data_cfg = run_file(out, "data", {**base, "stages": ["generate"], "run_dir": str(out / "data"),
                                          "generate": {"prompts": str(prompts), "endpoints": [double.url],
                                                       "temperature": 0.0, "max_tokens": args.max_new_tokens,
                                                       "format": "jsonl", "s3_upload": False,
                                                       "concurrency": 1,
                                                       "progress_interval_s": 30.0}})
        t0 = time.monotonic()
        if run_stages(data_cfg, force=True):
            raise SystemExit("generate failed")
        stage_time(timings, "generate", t0)
    t0 = time.monotonic()
    prep_cfg = run_file(out, "prepare", {**base, "stages": ["prepare"], "run_dir": str(out / "data"),
                                         "data": {**base["data"],
                                                  "completions": str(out / "data" / "generated")}})
    if run_stages(prep_cfg, force=True):
        raise SystemExit("prepare failed")
    stage_time(timings, "prepare", t0)
    layout = RunLayout.of(prep_cfg)
    t0 = time.monotonic()
    tgt_loss = target_loss(target, layout.heldout_shards)
    stage_time(timings, "target held-out loss", t0)

    rows: list[dict[str, Any]] = []

    def train_eval(label: str, name: str, extra: dict[str, Any], target_dir: Path) -> None:
        cfg = run_file(out, name, {**base, "target": {**base["target"], "path": str(target_dir)},
                                   "stages": ["train", "eval"], "run_dir": str(out / name), **extra})
        t = time.monotonic()
        if run_stages(cfg, force=True):
            raise SystemExit(f"{name}: train/eval failed")
        res = json.loads(RunLayout.of(cfg).eval_result(cfg.train.max_steps).read_text())
        rows.append({"row": label, "tau": res["tau_mean"], "slot_acc": res["slot_acc"],
                     "blocks": res["blocks"],
                     "split": res["split"], "seconds": round(time.monotonic() - t, 1)})
        stage_time(timings, "train+eval", t)

    # baseline: the drafter before its first step, scored by the same eval
    t = time.monotonic()
    cfg0 = run_file(out, "untrained", {**base, "stages": ["eval"], "run_dir": str(out / "untrained")})
    ck = Trainer(cfg0).save()
    res0 = evaluate(cfg0, ck)
    rows.append({"row": "untrained drafter", "tau": res0.tau_mean, "slot_acc": res0.slot_acc,
                 "blocks": res0.blocks, "split": res0.split, "seconds": round(time.monotonic() - t, 1)})
    stage_time(timings, "train+eval", t)
    if not args.no_random_target:
        train_eval("random target, CE", "random-target-ce", {"loss": VARIANTS["CE"]}, random_target)
    for v in args.variants:
        train_eval(f"{v}", f"variant-{v.lower().replace('+', '-')}", {"loss": VARIANTS[v]}, target)
    return {"corpus": str(args.corpus or "built-in walks"), "lines": len(lines),
            "block_size": args.block_size, "steps": args.steps, "target_steps": args.target_steps,
            "target_train_loss": round(target_train_loss, 4),
            "target_heldout_loss": round(tgt_loss, 4), "rows": rows,
            "timings": {k: round(v, 1) for k, v in timings.items()}, "threads": args.threads}


def format_table(r: dict[str, Any]) -> str:
    lines = [f"corpus: {r['corpus']} ({r['lines']} lines), block size {r['block_size']}, drafter steps "
             f"{r['steps']}, target steps {r['target_steps']}, {r['threads']} threads",
             f"target: train loss {r['target_train_loss']:.3f}, held-out loss {r['target_heldout_loss']:.3f} "
             f"per supervised token (ppl {math.exp(r['target_heldout_loss']):.2f})",
             "",
             f"| {'drafter':<20} | held-out tau | per-slot acceptance (slots 1..B-1) | blocks | s |",
             f"|{'-' * 22}|-------------:|-------------------------------------|-------:|--:|"]
    for row in r["rows"]:
        acc = " ".join(f"{a:.2f}" for a in row["slot_acc"])
        lines.append(f"| {row['row']:<20} | {row['tau']:12.3f} | {acc:<35} | {row['blocks']:>6} | "
                     f"{row['seconds']:.0f} |")
    lines += ["", "time per stage (s): " + ", ".join(f"{k} {v:.0f}" for k, v in r["timings"].items())
              + f"; total {sum(r['timings'].values()):.0f}"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, default=None,
                   help="text lines to learn (default: the built-in walks)")
    p.add_argument("--out", type=Path, default=None, help="working directory (default: a temporary one)")
    p.add_argument("--words", type=int, default=48, help="words of the built-in language's ordering")
    p.add_argument("--prompt-words", type=int, default=3, help="words of a line that form the user turn")
    p.add_argument("--max-lines", type=int, default=0, help="use at most this many lines (0 = all)")
    p.add_argument("--target-steps", type=int, default=600, help="optimizer steps of the target (batch 8)")
    p.add_argument("--steps", type=int, default=150, help="drafter optimizer steps per variant")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--anchors", type=int, default=32, help="drafter.max_anchors")
    p.add_argument("--max-length", type=int, default=128, help="data.max_length (and the double's budget)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="generate.max_tokens")
    p.add_argument("--heldout-share", type=float, default=0.2)
    p.add_argument("--eval-samples", type=int, default=64)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--no-random-target", action="store_true", help="skip the random-target baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    t0 = time.monotonic()
    if args.out is None:
        with tempfile.TemporaryDirectory(prefix="learning-") as tmp:
            args.out = Path(tmp)
            result = run(args)
    else:
        result = run(args)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print(format_table(result))
    print(f"wall time {result['wall_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
